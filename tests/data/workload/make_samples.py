"""Writes the small generated sample traces next to this file (run once; the outputs are committed).

mooncake_sample.jsonl: Mooncake-style records (timestamp in ms, input_length, output_length, hash_ids of
512-token blocks); requests 0, 3, 6, ... share their first two blocks (a shared system prompt), the others
have their own. azure_sample.csv: the Azure LLM inference trace columns (TIMESTAMP as a datetime string with
7 fractional digits, ContextTokens, GeneratedTokens). Both are synthetic: no real traffic is in them.
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def main() -> None:
    rng = random.Random(16)
    t = 0.0
    lines = []
    next_hash = 100
    for i in range(12):
        n_in = rng.randint(1030, 1600)
        blocks = -(-n_in // 512)
        if i % 3 == 0:
            ids = [1, 2] + list(range(next_hash, next_hash + blocks - 2))
        else:
            ids = list(range(next_hash, next_hash + blocks))
        next_hash += blocks
        lines.append(json.dumps({"timestamp": round(t), "input_length": n_in,
                                 "output_length": rng.randint(4, 12), "hash_ids": ids}))
        t += rng.expovariate(8.0) * 1000
    (HERE / "mooncake_sample.jsonl").write_text("\n".join(lines) + "\n")
    start = dt.datetime(2023, 11, 16, 18, 15, 46, 680590)
    rows = []
    t = 0.0
    for _ in range(12):
        ts = start + dt.timedelta(seconds=t)
        rows.append([ts.strftime("%Y-%m-%d %H:%M:%S.%f") + "0", rng.randint(20, 300), rng.randint(3, 12)])
        t += rng.expovariate(8.0)
    with (HERE / "azure_sample.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        w.writerows(rows)


if __name__ == "__main__":
    main()
