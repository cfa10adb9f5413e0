# Python's os.closerange on a connected socket, then a file gets the number:
# python3 closerange.py udp|tcp ADDR PORT DIR
import os, socket, sys, time
proto, addr, port, d = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM if proto == "tcp" else socket.SOCK_DGRAM)
s.connect((addr, port))
s.send(b"hello")
time.sleep(0.1)
fd = s.detach()
os.closerange(fd, fd + 1)
print("closed by os.closerange", flush=True)
f = os.open(os.path.join(d, "ledger.txt"), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
print("file got the socket's number:", "yes" if f == fd else "no")
print("write:", os.write(f, b"ACCOUNT 1234 PIN 9876\n"))
os.lseek(f, 0, os.SEEK_SET)
print("read back:", os.read(f, 100))
os.close(f)
print("file holds:", open(os.path.join(d, "ledger.txt"), "rb").read(), flush=True)
time.sleep(0.2)
