# Connects, writes 150,000 bytes (they fit its send buffer: the sink does
# not read yet, so most are unsent or unacknowledged), says "written" and
# waits to be killed (kill -9 by the test).
import os, socket, sys, time

addr, port = sys.argv[1], int(sys.argv[2])
c = socket.socket()
c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 100000)
c.connect((addr, port))
c.sendall(bytes((i * 7 + 3) & 0xFF for i in range(150000)))
print(f"written pid {os.getpid()} .", flush=True)
time.sleep(60)
