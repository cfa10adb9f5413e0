"""Hand-made IPv4/UDP frames for the drop-in matrix (item 8): valid IP
options, and martian sources the kernel drops.

usage: rawtx.py DST PORT COUNT OWNADDR
Sends COUNT of each: 'opt:' with IHL 6 (4 NOP options) from OWNADDR,
'plain:' without options from OWNADDR, 'own:' from DST itself (the
receiver's own address), 'bcast:' from 255.255.255.255.
"""
import socket
import struct
import sys
import time

dst, port, count, own = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack(f"!{len(b) // 2}H", b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def frame(src, payload, options=b""):
    ihl = 5 + len(options) // 4
    udp_len = 8 + len(payload)
    total = ihl * 4 + udp_len
    ip = struct.pack("!BBHHHBBH4s4s", (4 << 4) | ihl, 0, total, 0x1234, 0, 64, 17, 0,
                     socket.inet_aton(src), socket.inet_aton(dst)) + options
    ip = ip[:10] + struct.pack("!H", csum(ip)) + ip[12:]
    pseudo = socket.inet_aton(src) + socket.inet_aton(dst) + struct.pack("!BBH", 0, 17, udp_len)
    udp = struct.pack("!HHHH", 40000, port, udp_len, 0) + payload
    c = csum(pseudo + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", c) + udp[8:]
    return ip + udp


s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
s.setsockopt(socket.IPPROTO_IP, socket.IP_HDRINCL, 1)
kinds = [("opt", own, b"\x01\x01\x01\x01"), ("plain", own, b""), ("own", dst, b""),
         ("bcast", "255.255.255.255", b"")]
for tag, src, opts in kinds:
    for i in range(count):
        s.sendto(frame(src, f"{tag}:{i:04d}".encode(), opts), (dst, 0))
        time.sleep(0.002)
print("sent", flush=True)
