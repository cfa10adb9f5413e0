"""SO_TIMESTAMPNS and SO_TIMESTAMPING from Python (socket.recvmsg with ancillary data), normalized:
run plainly and under `nanowire run`, outputs compared (crates/nanowire/tests/timestamping.rs).
Usage: timestamping.py LOCAL PEER PORT (an echo server at PEER:PORT, inside the lab)."""
import select, socket, struct, sys, time

local, peer, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
SO_TIMESTAMPING = 37
SO_TIMESTAMPNS = 35
SOF_TX_SOFTWARE, SOF_RX_SOFTWARE, SOF_SOFTWARE, SOF_OPT_ID, SOF_OPT_TSONLY = 2, 8, 16, 128, 2048
IP_RECVERR = 11


def show(what, s, flags, lo):
    data, anc, mflags, addr = s.recvmsg(2048, 1024, flags)
    hi = time.time_ns()
    out = []
    for level, kind, blob in anc:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
            sec, ns = struct.unpack("qq", blob[:16])
            out.append(f"TIMESTAMPNS in_window={lo <= sec * 10**9 + ns <= hi}")
        elif level == socket.SOL_SOCKET and kind == SO_TIMESTAMPING:
            sec, ns = struct.unpack("qq", blob[:16])
            out.append(f"TIMESTAMPING in_window={lo <= sec * 10**9 + ns <= hi} rest_zero={blob[16:48] == bytes(32)}")
        elif level == socket.IPPROTO_IP and kind == IP_RECVERR:
            errno_, origin, _t, _c, _p, info, key = struct.unpack("IBBBBII", blob[:16])
            out.append(f"RECVERR errno={errno_} origin={origin} info={info} key={key}")
        else:
            out.append(f"other {level}/{kind}")
    print(f"{what}: len={len(data)} errqueue={bool(mflags & socket.MSG_ERRQUEUE)} {'; '.join(out)}", flush=True)


a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
a.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
a.bind((local, 12611))
b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
b.bind((local, 12612))
b.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING,
             SOF_TX_SOFTWARE | SOF_RX_SOFTWARE | SOF_SOFTWARE | SOF_OPT_ID | SOF_OPT_TSONLY)
# The kernel switches its receive stamping on from a workqueue after the
# first socket asks: let it happen before measuring.
time.sleep(0.1)
for i in range(3):
    t0 = time.time_ns()
    a.sendto(b"py-ns-%d" % i, (peer, port))
    show("ns rx", a, 0, t0)
    t0 = time.time_ns()
    b.sendto(b"py-ts-%d" % i, (peer, port))
    p = select.poll()
    p.register(b, 0)
    ev = p.poll(2000)
    print("ts pollerr:", bool(ev and ev[0][1] & select.POLLERR), flush=True)
    show("ts errqueue", b, socket.MSG_ERRQUEUE, t0)
    show("ts rx", b, 0, t0)
