"""UDP sender for the drop-in matrix.

usage: tx.py ADDR PORT COUNT SIZE[,SIZE...] [--ifaddr A] [--tag T] [--wait-ack]
Sends COUNT datagrams of each size (payload 'TAG:' then filler), paced;
--ifaddr sets IP_MULTICAST_IF. Prints 'sent N'.
"""
import socket
import sys
import time

addr, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sizes = [int(x) for x in sys.argv[4].split(",")]
args = sys.argv[5:]
tag = args[args.index("--tag") + 1] if "--tag" in args else "d"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
if "--ifaddr" in args:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                 socket.inet_aton(args[args.index("--ifaddr") + 1]))
n = 0
for size in sizes:
    head = f"{tag}:".encode()
    p = head + b"x" * (size - len(head))
    for i in range(count):
        s.sendto(p, (addr, port))
        n += 1
        time.sleep(0.002 if size < 9000 else 0.004)
print(f"sent {n}", flush=True)
