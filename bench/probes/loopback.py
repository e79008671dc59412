"""Loopback TCP throughput in Python: 128 MiB per transfer (compare with loopback.ts).

    python3 bench/probes/loopback.py
"""
import socket, threading, time, os
N = 128 << 20
data = memoryview(os.urandom(N))
srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(1)
port = srv.getsockname()[1]
buf = bytearray(N); view = memoryview(buf)
def recv():
    c, _ = srv.accept()
    for _ in range(5):
        got = 0
        while got < N:
            got += c.recv_into(view[got:], N - got)
        c.sendall(b"k")
threading.Thread(target=recv, daemon=True).start()
s = socket.create_connection(("127.0.0.1", port))
for _ in range(5):
    t0 = time.perf_counter(); s.sendall(data); s.recv(1); dt = time.perf_counter() - t0
    print(f"python loopback 128 MiB: {dt*1000:.1f} ms ({N/dt/1e9:.2f} GB/s)")
