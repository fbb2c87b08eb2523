"""Merge the run directories several device calls brought back into one findings run and render its report.
Each part keeps its own command and commit in meta.json ("parts"); records are copied unchanged.

Usage: python reports/h200/merge_runs.py OUT NOTES_FILE COMMIT:RUN_DIR [COMMIT:RUN_DIR ...]"""
import json
import sys
from pathlib import Path

from kdbench import report
from kdbench.results import RunWriter, load_meta, load_records


def main(out: str, notes_file: str, parts: list[str]) -> None:
    out_dir = Path(out)
    for name in ("records.jsonl", "results.csv"):
        (out_dir / name).unlink(missing_ok=True)
    writer, metas = RunWriter(out_dir), []
    for part in parts:
        commit, run = part.split(":", 1)
        for rec in load_records(Path(run)):
            writer.add(rec)
        meta = load_meta(Path(run))
        metas.append({"commit": commit, "command": meta.get("command", ""), "status": meta.get("status", ""),
                      "started_at": meta.get("started_at", ""), "n_records": meta.get("n_records")})
    first = load_meta(Path(parts[0].split(":", 1)[1]))
    writer.write_meta({**first, "status": "finished", "notes": Path(notes_file).read_text().strip(),
                       "commands": [f"{m['command']}  (commit {m['commit']})" for m in metas], "parts": metas,
                       "scenarios": [s for p in parts for s in load_meta(Path(p.split(':', 1)[1])).get("scenarios", [])]})
    print(report.render(out_dir))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
