"""Multicast for the shim tests.

usage: mcast.py recv GROUP PORT COUNT [IFADDR]   join GROUP on IFADDR (default 0.0.0.0: the
                                        kernel's choice, which needs a route), print 'ready',
                                        receive COUNT datagrams, print 'got N'
       mcast.py send GROUP PORT COUNT IFADDR   send COUNT numbered datagrams via IFADDR
"""
import socket
import struct
import sys
import time

mode, group, port, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
if mode == "recv":
    s.bind(("0.0.0.0", port))
    s.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                 struct.pack("4s4s", socket.inet_aton(group),
                             socket.inet_aton(sys.argv[5] if len(sys.argv) > 5 else "0.0.0.0")))
    s.settimeout(20)
    print("ready", flush=True)
    seen = set()
    while len(seen) < count:
        data, _ = s.recvfrom(2048)
        seen.add(int(data.decode()))
    print(f"got {len(seen)}", flush=True)
else:
    s.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF, socket.inet_aton(sys.argv[5]))
    for i in range(count):
        s.sendto(str(i).encode(), (group, port))
        time.sleep(0.002)
    print("sent", flush=True)
