# Connects, writes 4 MiB and exits at once by `how`: sys.exit (atexit
# handlers run), os._exit (libc _exit, no atexit handlers), the
# exit_group system call through libc's syscall(), or "close": close the
# socket, then os._exit.
import ctypes, os, socket, sys

addr, port, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
c = socket.create_connection((addr, port))
c.sendall(bytes((i * 7 + 3) & 0xFF for i in range(4 << 20)))
if how == "close":
    c.close()
if how in ("_exit", "close"):
    os._exit(0)
if how == "exit_group":
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall(231, 0)  # SYS_exit_group (x86-64)
sys.exit(0)
