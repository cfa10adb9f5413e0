"""Client for the echo tests: ping-pong and small bursts of numbered,
varied-size datagrams; every echo must come back byte for byte.

usage: udp_check.py ADDR PORT COUNT [--quit]
Prints 'ok N' and exits 0, or says what went wrong and exits 1.
"""
import os
import socket
import sys

addr, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
dst = (addr, port)


def payload(i):
    n = 8 + (i * 37) % 1400
    body = os.urandom(n - 8)
    return i.to_bytes(8, "big") + body


ok = 0
# ping-pong
for i in range(count):
    p = payload(i)
    s.sendto(p, dst)
    try:
        data, peer = s.recvfrom(65535)
    except socket.timeout:
        print(f"timeout waiting for echo {i}")
        sys.exit(1)
    if data != p:
        print(f"echo {i} differs: sent {len(p)} B, got {len(data)} B")
        sys.exit(1)
    ok += 1
# bursts of 32 small datagrams, then collect them all
for b in range(5):
    sent = {}
    for j in range(32):
        i = count + b * 32 + j
        p = i.to_bytes(8, "big") + os.urandom(56)
        sent[i] = p
        s.sendto(p, dst)
    for _ in range(32):
        try:
            data, peer = s.recvfrom(65535)
        except socket.timeout:
            print(f"burst {b}: {len(sent)} echoes missing")
            sys.exit(1)
        i = int.from_bytes(data[:8], "big")
        if sent.pop(i, None) != data:
            print(f"burst {b}: unexpected or corrupted echo {i}")
            sys.exit(1)
        ok += 1
if "--quit" in sys.argv:
    s.sendto(b"quit", dst)
print(f"ok {ok}")
