# The process that is killed with -9 while it holds connections.
#   killed.py server ADDR PORT N PENDING: listens, accepts N connections,
#     reads each hello "<i>\n" (an odd i's is left unread), answers
#     "ack <i>\n"; PENDING more wait in its accept queue. Prints "held".
#   killed.py client ADDR PORT N: N connections, each sends "<i>\n" and
#     reads exactly "ack <i>\n" (anything after it stays unread). Prints
#     "held".
# Either half-closes (shutdown, its FIN) the connections whose i is a
# multiple of 4 and waits until the peer acknowledged the FIN: they are in
# FIN-WAIT-2 when it is killed (a peer's ACK still on its way at the kill
# would reach a host with no socket for it, on an engine of its own: see
# docs/architecture.md, "Exit and kill -9", the window before the end).
# Then it sleeps until it is killed (SIGKILL), or until SIGUSR1: then it
# half-closes the connections whose i is 2 more than a multiple of 4 when
# KILLED_FIN_AT_KILL=1 is in its environment, and kills itself (SIGKILL)
# at once: the peer's ACKs of those FINs come after its death.
import os, signal, socket, sys, time

role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
held, halves = [], []


def fin_wait_2(c):
    # struct tcp_info's state: 5 is FIN-WAIT-2.
    end = time.time() + 10
    while c.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] != 5 and time.time() < end:
        time.sleep(0.005)


def line(c, peek):
    d = b""
    while not d.endswith(b"\n"):
        d = c.recv(64, socket.MSG_PEEK) if peek else d + c.recv(1)
    return d


if role == "server":
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind((addr, port))
    s.listen(n + int(sys.argv[5]) + 16)
    print("listening", flush=True)
    for _ in range(n):
        c, _ = s.accept()
        d = line(c, True)
        i = int(d)
        if i % 2 == 0:
            c.recv(len(d))
        c.sendall(b"ack %d\n" % i)
        if i % 4 == 0:
            c.shutdown(socket.SHUT_WR)
            halves.append(c)
        held.append(c)
else:
    for i in range(n):
        c = socket.create_connection((addr, port), timeout=60)
        c.sendall(b"%d\n" % i)
        assert line(c, False) == b"ack %d\n" % i
        if i % 4 == 0:
            c.shutdown(socket.SHUT_WR)
            halves.append(c)
        held.append(c)
for c in halves:
    fin_wait_2(c)


def at_kill(*_):
    if os.environ.get("KILLED_FIN_AT_KILL") == "1":
        for c in held[2::4]:
            c.shutdown(socket.SHUT_WR)
    os.kill(os.getpid(), signal.SIGKILL)


signal.signal(signal.SIGUSR1, at_kill)
print("held", flush=True)
while True:
    time.sleep(3600)
