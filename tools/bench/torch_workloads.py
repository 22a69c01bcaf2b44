"""PyTorch side of W6a (docs/workloads.md): the training-ingest pipeline
with PyTorch's own tools, as its documentation shows them. Two rank
processes (this script with `--rank`), each a `DataLoader` over the same
JPEGs with a `DistributedSampler` (2 replicas, shuffled, seed 7,
`set_epoch` every epoch) and worker processes (1 per rank by default: the
2 cores in all), batches of 64; the transforms in PIL and numpy (random
resized crop to 224, flip, normalise to f32), as streambatch's. A rank's
step is the same fixed sleep per batch as streambatch's trainers'. Each
rank checks every value it gets and prints its ids per epoch; the driver
checks that every image of each epoch came once and prints one JSON line
with the keys `streambatch bench w6a` prints. The wall time runs from the
first rank's start of its first epoch (Python started, torch imported, the
dataset made: streambatch's trainers take milliseconds to start) to the
last rank's end.

    python tools/bench/torch_workloads.py w6a [--step-ms 110] [--workers 1]
"""

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np
from PIL import Image

from common import W6_EPOCHS, W6_IMAGES, W6_INPUT, W6_SEED, augment, image_id, line, normalised_rows, vmhwm_mib

RANKS = 2
BATCH = 64


class Images:
    """The JPEGs as a map-style dataset, each decoded and augmented when
    asked for: its crop and flip seeded by the epoch and its index, new
    every epoch."""

    def __init__(self, paths):
        self.paths = paths
        self.epoch = 0

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with Image.open(self.paths[i]) as image:
            rng = np.random.default_rng((W6_SEED, self.epoch, i))
            return augment(image.convert("RGB"), rng), image_id(self.paths[i])


def rank_main(args):
    # Imported by the ranks only: the driver that starts them stays small.
    import torch
    from torch.utils.data import DataLoader, DistributedSampler

    torch.set_num_threads(1)
    paths = sorted(os.path.join(W6_INPUT, f) for f in os.listdir(W6_INPUT) if f.endswith(".jpg"))
    images = Images(paths)
    sampler = DistributedSampler(images, num_replicas=RANKS, rank=args.rank, shuffle=True, seed=W6_SEED)
    # Workers start anew each epoch (not persistent), so each gets the epoch.
    loader = DataLoader(images, batch_size=BATCH, sampler=sampler, num_workers=args.workers)
    step = args.step_ms / 1000
    print(json.dumps({"rank": args.rank, "started_unix": time.time()}), flush=True)
    for epoch in range(W6_EPOCHS):
        sampler.set_epoch(epoch)
        images.epoch = epoch
        started, waited, ids, wrong = time.perf_counter(), 0.0, [], 0
        batches = iter(loader)
        while True:
            asked = time.perf_counter()
            try:
                pixels, batch_ids = next(batches)
            except StopIteration:
                break
            waited += time.perf_counter() - asked
            wrong += normalised_rows(pixels.numpy())
            ids.extend(int(i) for i in batch_ids)
            time.sleep(step)  # the training step
        took = time.perf_counter() - started
        print(json.dumps({"rank": args.rank, "epoch": epoch, "took_s": took, "waited_s": waited, "wrong_rows": wrong, "ids": ids}), flush=True)
    print(json.dumps({"peak_rss_mib": vmhwm_mib(), "ended_unix": time.time()}), flush=True)


def w6a(args):
    from common import IdSet

    ranks = [
        subprocess.Popen(
            [sys.executable, __file__, "w6a", "--rank", str(r), "--step-ms", str(args.step_ms), "--workers", str(args.workers)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(RANKS)
    ]
    outputs = [p.communicate()[0] for p in ranks]
    epochs = [IdSet(W6_IMAGES) for _ in range(W6_EPOCHS)]
    wrong, delivered, fractions, starts, ends = 0, 0, [], [], []
    for out in outputs:
        took = waited = 0.0
        for l in out.splitlines():
            r = json.loads(l)
            starts += [r["started_unix"]] if "started_unix" in r else []
            ends += [r["ended_unix"]] if "ended_unix" in r else []
            if "epoch" not in r:
                continue
            took += r["took_s"]
            waited += r["waited_s"]
            wrong += r["wrong_rows"]
            delivered += len(r["ids"])
            epochs[r["epoch"]].add(r["ids"])
        fractions.append(round(waited / took, 3) if took else 1.0)
    correct = all(p.returncode == 0 for p in ranks) and wrong == 0 and all(e.each_once() for e in epochs)
    wall = max(ends) - min(starts) if starts and ends else float("nan")
    line(
        "pytorch",
        "w6a",
        f"step_ms={args.step_ms}",
        wall,
        delivered,
        0,
        correct,
        images_per_s=round(delivered / wall, 3),
        trainer_wait_fraction=fractions,
        workers_per_rank=args.workers,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("workload", choices=["w6a"])
    parser.add_argument("--step-ms", type=int, default=110)
    parser.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    parser.add_argument("--rank", type=int, default=None, help="(internal) run as this rank")
    args = parser.parse_args()
    if args.rank is None:
        w6a(args)
    else:
        rank_main(args)


if __name__ == "__main__":
    main()
