"""ncu's SASS source page (`ncu --import R.ncu-rep --page source --csv --print-source sass`, gzipped) -> a markdown
table of warp instructions executed and warp-stall samples per opcode (predicates and modifiers dropped), for the
kernel results named by index (their order in the report; each result appears as two equal sections, the even index
is used), sorted by the first result's excess over the last. plans/0004 tree_build, Session 19.
Usage: python3 reports/h200/ncu_sass_ops.py SRC.csv.gz LABEL=INDEX [LABEL=INDEX ...] > OUT.md"""
import collections
import csv
import gzip
import sys


def sections(path: str) -> list[dict]:
    out, hdr = [], None
    for line in gzip.open(path, "rt"):
        if line.startswith('"Kernel Name"'):
            out.append({"name": next(csv.reader([line]))[1], "rows": []})
        elif line.startswith('"Address"'):
            hdr = next(csv.reader([line]))
        elif out and line.startswith('"0x'):
            out[-1]["rows"].append(dict(zip(hdr, next(csv.reader([line])))))
    return out


def per_opcode(sec: dict) -> tuple[collections.Counter, collections.Counter]:
    inst, samples = collections.Counter(), collections.Counter()
    for r in sec["rows"]:
        words = r["Source"].split()
        if not words:
            continue
        op = (words[1] if words[0].startswith("@") else words[0]).split(".")[0]
        inst[op] += int(r["Instructions Executed"] or 0)
        samples[op] += int(r["Warp Stall Sampling (All Samples)"] or 0)
    return inst, samples


def main() -> None:
    secs = sections(sys.argv[1])
    picks = [(a.split("=")[0], per_opcode(secs[int(a.split("=")[1])])) for a in sys.argv[2:]]
    labels = [p[0] for p in picks]
    print("| | " + " | ".join(labels) + " |\n| --- |" + " --- |" * len(labels))
    print("| warp instructions | " + " | ".join(f"{sum(i.values()) / 1e6:.1f}M" for _, (i, _s) in picks) + " |")
    print("| stall samples | " + " | ".join(str(sum(s.values())) for _, (_i, s) in picks) + " |\n")
    first, last = picks[0][1][0], picks[-1][1][0]
    print("| opcode | " + " | ".join(f"{x} (M)" for x in labels) + " | samples " + " / ".join(labels) + " |")
    print("| --- |" + " --- |" * (len(labels) + 1))
    for op in sorted(first, key=lambda o: -(first[o] - last.get(o, 0)))[:16]:
        cells = " | ".join(f"{i.get(op, 0) / 1e6:.2f}" for _, (i, _s) in picks)
        print(f"| {op} | {cells} | " + " / ".join(str(s.get(op, 0)) for _, (_i, s) in picks) + " |")


if __name__ == "__main__":
    main()
