"""``opsched cache status | list | clear | export FILE | import FILE``: the profile store, and
the schedule cache of the ``torch.compile`` backend beside it (status, list and clear)."""

from __future__ import annotations

import argparse
import json
import time
from typing import TYPE_CHECKING

from opsched.cli.main import Handler, subcommand
from opsched.cli.table import format_table

if TYPE_CHECKING:
    from opsched.schedule_cache import ScheduleCache


@subcommand("cache", "inspect or manage the profile store of stage measurements and the schedule cache")
def _setup(p: argparse.ArgumentParser) -> Handler:
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    parsers = {
        "status": actions.add_parser("status", help="where the store and the schedule cache are, and what they hold"),
        "list": actions.add_parser("list", help="every schedule torch.compile(backend='opsched') cached, one a line "
                                   "(each file is a schedule: opsched show FILE)"),
        "clear": actions.add_parser("clear", help="remove every measurement and every cached schedule"),
        "export": actions.add_parser("export", help="write every measurement to FILE (JSON lines)"),
        "import": actions.add_parser("import", help="merge measurements exported to FILE"),
    }
    for action, sub in parsers.items():
        sub.add_argument("--cache-dir", help="the cache directory (default: $OPSCHED_CACHE_DIR or the user cache)")
        if action in ("export", "import"):
            sub.add_argument("file", help="a JSON-lines file")
    for action in ("status", "list"):
        parsers[action].add_argument("--json", action="store_true", help=f"{action} as JSON")

    def run(args: argparse.Namespace) -> int:
        from opsched.cost import ProfileStore
        from opsched.schedule_cache import ScheduleCache

        schedules = ScheduleCache(args.cache_dir)
        if args.action == "list":
            _list(schedules, args.json)
            return 0
        with ProfileStore(args.cache_dir) as store:
            if args.action == "status":
                status = {**store.status(), "schedule_cache": schedules.status()}
                if args.json:
                    print(json.dumps(status, indent=1))
                    return 0
                print(f"profile store {status['path']} (schema {status['schema_version']}): "
                      f"{status['measurements']} measurements, {int(status['bytes']) / 1024:.1f} KiB")  # type: ignore[call-overload]
                rows = [[c["device"], c["backend"], c["versions"], c["batch"], c["measurements"]]
                        for c in status["contexts"]]  # type: ignore[attr-defined]
                if rows:
                    print(format_table(["device", "backend", "versions", "batch", "measurements"], rows))
                cached = schedules.status()
                print(f"schedule cache {cached['path']} (format {cached['format']}): {cached['schedules']} "
                      f"schedules (it keeps at most {cached['max_schedules']}), {cached['bytes'] / 1024:.1f} KiB")
            elif args.action == "clear":
                print(f"removed {store.clear()} measurements from {store.path} and {schedules.clear()} schedules "
                      f"from {schedules.directory}")
            elif args.action == "export":
                print(f"wrote {store.export(args.file)} measurements to {args.file}")
            else:
                print(f"merged {store.import_(args.file)} measurements from {args.file} into {store.path}")
        return 0
    return run


def _list(schedules: ScheduleCache, as_json: bool) -> None:
    entries = schedules.entries()
    if as_json:
        print(json.dumps(entries, indent=1))
        return
    print(f"schedule cache {schedules.directory}: {len(entries)} schedules")
    rows = []
    for e in entries:
        about = e["about"]
        inputs = " ".join("x".join(map(str, shape)) for shape in about.get("inputs", []))
        estimate = "" if e["estimated_ms"] is None else f"{e['estimated_ms']:.3f}"
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(e["created"]))
        rows.append([e["file"], about.get("operators", ""), inputs, e["scheduler"], e["backend"], estimate,
                     f"{e['search_seconds']:.1f}", created])
    if rows:
        print(format_table(["file", "operators", "inputs", "scheduler", "backend", "estimated ms", "search s",
                            "created"], rows))
