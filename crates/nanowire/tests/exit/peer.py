# The plain peer of a process killed with -9 (killed.py), in the other host.
#   peer.py client ADDR PORT N PENDING: N + PENDING connections to the
#     killed server, each sends "<i>\n"; the first N read "ack <i>\n".
#   peer.py server ADDR PORT N: accepts the killed client's N connections,
#     reads each "<i>\n", answers "ack <i>\n" and, for an odd i, "more\n"
#     in the same segment (left unread by the client).
# Prints "ready", then waits (30 s at most: a hang shows as "timeout", with
# the connection's TCP_INFO) for each connection's end: one line
# "<i> eof|reset|data|timeout ..." each. Once every connection ended, it
# sends its own FIN (shutdown) on each that ended with an end of file, a
# segment that comes after the other side is gone (the killed one
# half-closed some before it was killed: FIN-WAIT-2), and waits for the
# kernel's answer (an ACK from the closed socket's FIN-WAIT-2: the
# connection closes cleanly); anything else is added to the line ("eof then
# reset": answered with a RST, "eof then stuck (state S)").
import selectors, socket, sys, time

role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
conns = {}
if role == "client":
    for i in range(n + int(sys.argv[5])):
        c = socket.create_connection((addr, port), timeout=60)
        c.sendall(b"%d\n" % i)
        if i < n:
            want, got = b"ack %d\n" % i, b""
            while len(got) < len(want):
                d = c.recv(len(want) - len(got))
                if not d:
                    break
                got += d
            assert got == want, (i, got)
        conns[i] = c
else:
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(n + 16)
    print("listening", flush=True)
    for _ in range(n):
        c, _ = s.accept()
        d = b""
        while not d.endswith(b"\n"):
            d += c.recv(64)
        i = int(d)
        c.sendall(b"ack %d\n" % i + (b"more\n" if i % 2 else b""))
        conns[i] = c
print("ready", flush=True)
sel = selectors.DefaultSelector()
for i, c in conns.items():
    c.setblocking(False)
    sel.register(c, selectors.EVENT_READ, i)
out = {}
end = time.time() + 30
while len(out) < len(conns) and time.time() < end:
    for key, _ in sel.select(timeout=max(0.0, end - time.time())):
        try:
            d = key.fileobj.recv(4096)
            out[key.data] = "eof" if not d else "data"
        except ConnectionResetError:
            out[key.data] = "reset"
        except BlockingIOError:
            continue
        sel.unregister(key.fileobj)

def closed(c):
    # struct tcp_info's state: 7 is CLOSE (LAST-ACK answered).
    return c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == 7


eofs = [i for i, e in out.items() if e == "eof"]
for i in list(eofs):
    try:
        conns[i].shutdown(socket.SHUT_WR)
    except OSError as e:
        # Reset before it (ENOTCONN: the connection is closed).
        out[i] += " then " + ("reset" if e.errno == 107 else "error %d" % e.errno)
        eofs.remove(i)
end = time.time() + 30
for i in eofs:
    c = conns[i]
    while not closed(c) and time.time() < end:
        time.sleep(0.01)
    err = c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if not closed(c):
        out[i] += " then stuck (state %d)" % c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0]
    elif err:
        out[i] += " then " + ("reset" if err == 104 else "error %d" % err)
for i in sorted(conns):
    end = out.get(i)
    if end is None:
        # What the kernel knows of a connection that saw no end: its state,
        # bytes sent and not acknowledged, retransmissions so far (struct
        # tcp_info: state at 0, backoff at 4, unacked at 24, total_retrans
        # at 100): was its last data taken, did it retry?
        t = conns[i].getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
        u32 = lambda at: int.from_bytes(t[at:at + 4], "little")
        end = f"timeout (state {t[0]} backoff {t[4]} unacked {u32(24)} total_retrans {u32(100)})"
    print(i, end, flush=True)
