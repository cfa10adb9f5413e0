# The process that is killed with -9 while it holds connections.
#   killed.py server ADDR PORT N PENDING: listens, accepts N connections,
#     reads each hello "<i>\n" (an odd i's is left unread), answers
#     "ack <i>\n"; PENDING more wait in its accept queue. Prints "held".
#   killed.py client ADDR PORT N: N connections, each sends "<i>\n" and
#     reads exactly "ack <i>\n" (anything after it stays unread). Prints
#     "held".
# Then it sleeps until it is killed.
import socket, sys, time

role, addr, port, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
held = []


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
        held.append(c)
else:
    for i in range(n):
        c = socket.create_connection((addr, port), timeout=60)
        c.sendall(b"%d\n" % i)
        assert line(c, False) == b"ack %d\n" % i
        held.append(c)
print("held", flush=True)
while True:
    time.sleep(3600)
