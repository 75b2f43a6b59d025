#!/usr/bin/env python3
"""bench/gpu/streams_check.py: the caching allocator's stream rules on a
real GPU, step by step, for memsh's simulator (testdata/streams.star) to be
compared with.

  python3 bench/gpu/streams_check.py

prints one JSON line per step: its name, torch.cuda.memory_allocated(),
memory_stats()["active_bytes.all.current"] and memory_reserved(), relative
to the start. memsh completes a stream's events only when the stream (or
the device) is synchronized — the latest a GPU could finish — so here the
side stream is kept busy (torch.cuda._sleep) until then: the figures are
then the ones testdata/streams.star asserts (allocated drops at the free,
active once the event completed and the next allocation processed it;
a block freed on one stream is not reused by another).

Needs PyTorch with CUDA. Not run yet: no session so far had a GPU.
"""
import json

import torch

MiB = 1 << 20


def main():
    assert torch.cuda.is_available(), "needs a CUDA GPU"
    torch.cuda.empty_cache()
    base_alloc = torch.cuda.memory_allocated()
    base_res = torch.cuda.memory_reserved()

    def point(name):
        st = torch.cuda.memory_stats()
        print(json.dumps({
            "step": name,
            "allocated": torch.cuda.memory_allocated() - base_alloc,
            "active": st["active_bytes.all.current"] - base_alloc,
            "reserved": torch.cuda.memory_reserved() - base_res,
        }))

    # a block is reused only on its own stream
    s = torch.cuda.Stream()
    x = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    del x
    point("freed on the default stream")            # 0, 0, 20 MiB
    with torch.cuda.stream(s):
        y = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        point("allocated on the side stream")       # 4, 4, 40 MiB
    del y
    torch.cuda.synchronize()
    torch.cuda.empty_cache()

    # record_stream: the free waits for the side stream's event
    comm = torch.cuda.Stream()
    g = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    with torch.cuda.stream(comm):
        torch.cuda._sleep(2_000_000_000)             # keep comm busy
    g.record_stream(comm)
    del g
    point("freed, recorded on the busy stream")      # 0, 4, 20 MiB
    h = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
    point("second block beside the pending one")     # 4, 8, 20 MiB
    comm.synchronize()
    k = torch.empty(512, dtype=torch.uint8, device="cuda")
    point("stream synchronized, next allocation")    # 4 MiB + 512, same, 22 MiB
    del h, k
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    point("end")


if __name__ == "__main__":
    main()
