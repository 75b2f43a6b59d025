"""bench/interrupt/sigint.py MEMSH: five runs of heavy_heap.star on
sim:4GiB, each sent SIGINT 1.0-1.55 s after its loop starts; prints the
milliseconds from SIGINT to the traceback on stderr (memsh stopped the
statement and reported it) and from SIGINT to exit (130), which adds the
operating system's teardown of the process's memory."""
import signal
import statistics
import subprocess
import sys
import threading
import time

script = __file__.rsplit("/", 1)[0] + "/heavy_heap.star"
stop, lat = [], []
rc = None
for k in range(5):
    p = subprocess.Popen([sys.argv[1], "--device", "sim:4GiB", script],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    p.stdout.readline()  # "ready"
    seen = []

    def watch(p=p, seen=seen):
        for line in p.stderr:
            if line.startswith(b"Error") and not seen:  # "Error:" or "Error in <builtin>:"
                seen.append(time.monotonic())

    th = threading.Thread(target=watch)
    th.start()
    time.sleep(1.0 + 0.137 * k)
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)
    rc = p.wait()
    t1 = time.monotonic()
    th.join()
    stop.append((seen[0] - t0) * 1000 if seen else float("nan"))
    lat.append((t1 - t0) * 1000)
print(sys.argv[1], "rc", rc)
print("  SIGINT->traceback ms:", " ".join("%.0f" % x for x in stop), "median %.0f" % statistics.median(stop))
print("  SIGINT->exit ms:     ", " ".join("%.0f" % x for x in lat), "median %.0f" % statistics.median(lat))
