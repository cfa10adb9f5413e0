import ctypes, os, socket, sys, time
addr, peer, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
libc = ctypes.CDLL(None, use_errno=True)
# A connection closed first by us: it finishes (FIN-WAIT, TIME-WAIT) on
# the engine, which therefore lives on across the fork below.
c = socket.create_connection((peer, port)); c.sendall(b"x"); c.close()
time.sleep(0.3)
pid = os.fork()
if pid == 0:
    os.setgid(65534); os.setuid(65534)
    bpf = xsk = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            tgt = os.readlink("/proc/self/fd/" + fd)
        except OSError:
            continue
        if tgt.startswith("anon_inode:bpf"):
            bpf += 1
        if tgt.startswith("socket:"):
            v = ctypes.c_int(0); l = ctypes.c_uint(4)
            if libc.getsockopt(int(fd), 1, 39, ctypes.byref(v), ctypes.byref(l)) == 0 and v.value == 44:
                xsk += 1
    # One write(2) each (parent and child print at once; print's two
    # writes interleaved under PYTHONUNBUFFERED: session 27's CI).
    os.write(1, b"child uid %d: BPF fds %d, AF_XDP sockets %d\n" % (os.getuid(), bpf, xsk))
    time.sleep(float(sys.argv[4]))
    os._exit(0)
# After the fork: a UDP port on the engine (a claim in the steering map).
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind((addr, port))
os.write(1, b"parent ready\n")
time.sleep(60)
