"""UDP receiver for the drop-in matrix: bind, optionally join a group,
count what arrives until a silence, print a summary that does not depend
on timing.

usage: rx.py BINDADDR PORT [--reuse] [--join GROUP IFADDR] [--expect N]
             [--first S] [--gap S]
Prints 'ready' once bound, then after the first datagram and a second of
silence (or 10 s without any) 'got N' and one 'tag SIZE xCOUNT' line per
(payload tag, size) seen, sorted. The tag is the payload up to the first ':'.
--expect N stops at N datagrams; --first/--gap change the 10 s wait for the
first datagram and the 1 s of silence that ends the count (a test whose
sender starts late or stalls under load counts on the sender, not a clock).
"""
import socket
import struct
import sys
from collections import Counter

addr, port = sys.argv[1], int(sys.argv[2])
args = sys.argv[3:]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if "--reuse" in args:
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
s.bind((addr, port))
if "--join" in args:
    i = args.index("--join")
    mreq = struct.pack("4s4s", socket.inet_aton(args[i + 1]), socket.inet_aton(args[i + 2]))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
expect = int(args[args.index("--expect") + 1]) if "--expect" in args else None
first = float(args[args.index("--first") + 1]) if "--first" in args else 10.0
gap = float(args[args.index("--gap") + 1]) if "--gap" in args else 1.0
print("ready", flush=True)
seen = Counter()
n = 0
s.settimeout(first)
while True:
    try:
        data = s.recv(70000)
    except socket.timeout:
        break
    n += 1
    tag = data.split(b":", 1)[0].decode(errors="replace")
    seen[(tag, len(data))] += 1
    s.settimeout(gap)
    if expect is not None and n >= expect:
        break
print(f"got {n}")
for (tag, size), c in sorted(seen.items()):
    print(f"{tag} {size} x{c}")
