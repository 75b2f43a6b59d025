"""bench/interrupt/sigint.py MEMSH: five runs of heavy_heap.star on
sim:4GiB, each sent SIGINT 1.0-1.55 s after its loop starts; prints the
milliseconds from SIGINT to exit (130)."""
import signal
import statistics
import subprocess
import sys
import time

script = __file__.rsplit("/", 1)[0] + "/heavy_heap.star"
lat = []
rc = None
for k in range(5):
    p = subprocess.Popen([sys.argv[1], "--device", "sim:4GiB", script],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    p.stdout.readline()  # "ready"
    time.sleep(1.0 + 0.137 * k)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    rc = p.wait()
    lat.append((time.monotonic() - t0) * 1000)
print(sys.argv[1], "rc", rc, "SIGINT->exit ms:", " ".join("%.0f" % x for x in lat),
      "median %.0f" % statistics.median(lat))
