"""dumpfilt.py PID OUT: write each seccomp program of process PID (root; oldest first, as
installed) to OUT.0, OUT.1, ... in `struct sock_filter` form, via PTRACE_SECCOMP_GET_FILTER:
the programs exactly as the kernel runs them. The process is stopped while attached."""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.ptrace.restype = ctypes.c_long
libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_ATTACH, PTRACE_DETACH, PTRACE_SECCOMP_GET_FILTER = 16, 17, 0x420c
pid = int(sys.argv[1]); out = sys.argv[2]
if libc.ptrace(PTRACE_ATTACH, pid, None, None) < 0: raise OSError(ctypes.get_errno(), "attach")
os.waitpid(pid, 0)
i = 0
while True:
    n = libc.ptrace(PTRACE_SECCOMP_GET_FILTER, pid, ctypes.c_void_p(i), None)
    if n < 0: break
    buf = ctypes.create_string_buffer(n * 8)
    libc.ptrace(PTRACE_SECCOMP_GET_FILTER, pid, ctypes.c_void_p(i), buf)
    open(f"{out}.{i}", "wb").write(buf.raw); print(i, n, "insns")
    i += 1
libc.ptrace(PTRACE_DETACH, pid, None, None)
