# Fill a bytearray (256 MiB, or argv[1] MiB) with a pattern and check it.
import sys, hashlib
n = (int(sys.argv[1]) if len(sys.argv) > 1 else 256) << 20
b = bytearray(n)
pat = bytes(range(251)) * 4
step = len(pat)
for off in range(0, n - step + 1, step):
    b[off:off+step] = pat
tail = n % step
if tail: b[n-tail:] = pat[:tail]
ok = all(b[off:off+step] == pat for off in range(0, n - step + 1, step))
print("ok" if ok else "BAD", hashlib.sha256(b).hexdigest())
for l in open("/proc/self/status"):
    if l.startswith("VmHWM:"): print("vmhwm", int(l.split()[1]) * 1024, file=sys.stderr)
