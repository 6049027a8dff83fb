"""io_uring past the socket rules (issue 28, item 3): a unix socket made and connected by
io_uring operations (IORING_OP_SOCKET, IORING_OP_CONNECT), which no seccomp rule on
socket(2)/connect(2) sees. Usage: io_uring.py SOCKET_PATH. Prints one line and exits 0:
  setup-refused ERRNO    io_uring_setup failed (what the sandbox must give)
  socket-failed RES      the ring worked but the kernel refused the socket op
  connect RES            the connect op completed with RES (0: connected, the route is open)
Standard library only (ctypes, mmap, struct); x86_64 and aarch64 share the numbers."""
import ctypes
import mmap
import struct
import sys

SETUP, ENTER = 425, 426
OP_CONNECT, OP_SOCKET = 16, 45
ENTER_GETEVENTS = 1
OFF_SQ_RING, OFF_CQ_RING, OFF_SQES = 0, 0x8000000, 0x10000000

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def main():
    path = sys.argv[1].encode()
    params = ctypes.create_string_buffer(120)
    fd = libc.syscall(ctypes.c_long(SETUP), ctypes.c_uint(4), params)
    if fd < 0:
        print("setup-refused %d" % ctypes.get_errno(), flush=True)
        return
    sq_entries, cq_entries = struct.unpack_from("II", params.raw, 0)
    # io_sqring_offsets at 40: head tail ring_mask ring_entries flags dropped array resv1 user_addr
    sq = struct.unpack_from("IIIIIIII", params.raw, 40)
    # io_cqring_offsets at 80: head tail ring_mask ring_entries overflow cqes flags resv1 user_addr
    cq = struct.unpack_from("IIIIIIII", params.raw, 80)
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    sq_ring = mmap.mmap(fd, sq[6] + sq_entries * 4, mmap.MAP_SHARED, prot, offset=OFF_SQ_RING)
    cq_ring = mmap.mmap(fd, cq[5] + cq_entries * 16, mmap.MAP_SHARED, prot, offset=OFF_CQ_RING)
    sqes = mmap.mmap(fd, sq_entries * 64, mmap.MAP_SHARED, prot, offset=OFF_SQES)

    def run(opcode, sfd, off, addr, length):
        tail = struct.unpack_from("I", sq_ring, sq[1])[0]
        idx = tail & struct.unpack_from("I", sq_ring, sq[2])[0]
        sqe = bytearray(64)
        struct.pack_into("BBHiQQII", sqe, 0, opcode, 0, 0, sfd, off, addr, length, 0)
        sqes[idx * 64:(idx + 1) * 64] = bytes(sqe)
        struct.pack_into("I", sq_ring, sq[6] + idx * 4, idx)
        struct.pack_into("I", sq_ring, sq[1], tail + 1)
        n = libc.syscall(ctypes.c_long(ENTER), ctypes.c_int(fd), ctypes.c_uint(1),
                         ctypes.c_uint(1), ctypes.c_uint(ENTER_GETEVENTS), None, ctypes.c_size_t(0))
        if n < 0:
            return -ctypes.get_errno()
        head = struct.unpack_from("I", cq_ring, cq[0])[0]
        cqe = cq[5] + (head & struct.unpack_from("I", cq_ring, cq[2])[0]) * 16
        res = struct.unpack_from("i", cq_ring, cqe + 8)[0]
        struct.pack_into("I", cq_ring, cq[0], head + 1)
        return res

    sock = run(OP_SOCKET, 1, 1, 0, 0)  # AF_UNIX, SOCK_STREAM, protocol 0
    if sock < 0:
        print("socket-failed %d" % sock, flush=True)
        return
    addr = ctypes.create_string_buffer(struct.pack("H", 1) + path + b"\0", 110)
    res = run(OP_CONNECT, sock, 110, ctypes.addressof(addr), 0)
    print("connect %d" % res, flush=True)


main()
