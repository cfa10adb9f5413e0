# An active closer that exits at once, and a peer whose FIN is
# retransmitted after it (run_exit's TIME-WAIT case).
#   timewait.py client ADDR PORT N: N connections, each sends "<i>\n";
#     prints "held", waits for SIGUSR1, then closes each (its FIN first)
#     and exits: the kernel (or the shim at exit) finishes them.
#   timewait.py server ADDR PORT N: listens, accepts the N connections and
#     reads each hello ("ready"), then reads each to its end of file and
#     closes it (its FIN, answered by the client's last ACK, TIME-WAIT);
#     prints "closed N".
import signal, socket, sys

role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])

if role == "client":
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    conns = []
    for i in range(n):
        c = socket.create_connection((addr, port), timeout=60)
        c.sendall(b"%d\n" % i)
        conns.append(c)
    print("held", flush=True)
    signal.sigwait({signal.SIGUSR1})
    for c in conns:
        c.close()
    print("closed %d" % n, flush=True)
else:
    s = socket.create_server((addr, port), backlog=n + 16)  # SO_REUSEADDR
    print("listening", flush=True)
    conns = [s.accept()[0] for _ in range(n)]
    for c in conns:
        c.settimeout(60)
        while not c.recv(1) == b"\n":
            pass
    print("ready", flush=True)
    for c in conns:
        while c.recv(4096):
            pass
        c.close()
    print("closed %d" % n, flush=True)
