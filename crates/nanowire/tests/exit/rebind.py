# A server whose connections end in its own TIME-WAIT when it exits, and a
# later bind of its port (run_exit's rebind case).
#   rebind.py server ADDR PORT N REUSE: listens (SO_REUSEADDR when REUSE is
#     1), accepts N connections, reads each hello, shuts down its side
#     first (its FIN), reads to the client's end of file and closes: each
#     connection is in TIME-WAIT; prints "timewait N" and exits.
#   rebind.py client ADDR PORT N: N connections, each sends a hello; then
#     each is read to the server's end of file and closed; prints "ended N".
#   rebind.py bind ADDR PORT: a listener on the port with SO_REUSEADDR and
#     one without; prints what each bind gave ("ok" or the errno's name).
import errno, socket, sys

role, addr, port = sys.argv[1], sys.argv[2], int(sys.argv[3])

if role == "server":
    n, reuse = int(sys.argv[4]), int(sys.argv[5])
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
    s.bind((addr, port))
    s.listen(n + 16)
    print("listening", flush=True)
    conns = [s.accept()[0] for _ in range(n)]
    for c in conns:
        c.settimeout(60)
        assert c.recv(16).startswith(b"hello")
        c.shutdown(socket.SHUT_WR)
        assert c.recv(16) == b""
        c.close()
    s.close()
    print("timewait %d" % n, flush=True)
elif role == "client":
    n = int(sys.argv[4])
    conns = [socket.create_connection((addr, port), timeout=60) for _ in range(n)]
    for i, c in enumerate(conns):
        c.sendall(b"hello %d\n" % i)
    for c in conns:
        assert c.recv(16) == b""
        c.close()
    print("ended %d" % n, flush=True)
else:
    for reuse in (1, 0):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, reuse)
        try:
            s.bind((addr, port))
            s.listen(1)
            got = "ok"
        except OSError as e:
            got = errno.errorcode.get(e.errno, str(e.errno))
        print("bind with SO_REUSEADDR=%d: %s" % (reuse, got), flush=True)
        s.close()
