"""`rlckpt train`: the main job — a tiny GRPO on Ray + TransferQueue with transactional bundles."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from rlckpt.cli import _common, retention_args, train_stop
from rlckpt.controller.stopping import StopOutcome
from rlckpt.errors import FinalSaveAbortedError

if TYPE_CHECKING:
    from rlckpt.checkpoint.save import SaveHook
    from rlckpt.controller.config import TrainConfig
    from rlckpt.controller.loop import GenerateHook
    from rlckpt.controller.ranks.trainer_rank import SavePlannerFactory
    from rlckpt.controller.setup import SingleController
    from rlckpt.store import BundleStore

# --ray-connect-timeout's default: the library's (rlckpt.dataplane.ray_cluster.DEFAULT_CONNECT_TIMEOUT_S),
# which is not imported here because its package imports torch, and `rlckpt --help` stays fast.
DEFAULT_RAY_CONNECT_TIMEOUT_S = 30.0

EPILOG = """\
examples:
  rlckpt train --run-dir /nvme/run1 --steps 8 --save-every 2
  rlckpt train --run-dir /nvme/run1 --steps 16            # resumes from the newest committed bundle
  rlckpt train --run-dir s3://bucket/run1 --steps 8 --json \\
      --storage-options '{"endpoint_url": "http://127.0.0.1:9000"}'
  rlckpt train --run-dir /nvme/run1 --steps 100 --save-every 5 --keep-last 2 \\
      --replicate-to s3://bucket/run1 --replicate-every 2 --replica-keep-best 3 --metric reward
                  # saves at NVMe speed; every 2nd bundle is copied to S3 in the background
  rlckpt train --run-dir s3://bucket/run1 --trainer-ranks 4 --ray-address 10.0.0.1:6379 \\
      --trainer-resources '{"trainer_slot": 1}'   # on a cluster: one rank per node with that resource

With --replicate-to, a resume takes the newest bundle that verifies on either tier (the local one on
a tie): a fresh machine with an empty --run-dir resumes from the remote tier. Local retention never
deletes a bundle the remote tier does not hold yet.

--steps is the total to reach, across resumes: a run at step 4 with --steps 8 trains 4 more.
--signing-key signs every bundle's COMMIT (only the controller holds the key; trainer ranks never
see it) and makes a resume read only bundles that key signed for this run; --verify-key (alone, or
to verify with another key) does the latter. Unsigned or badly signed bundles are skipped like
corrupt ones (stderr, skipped_bundles in --json). Keys come from `rlckpt keygen`.
A resume may use another --trainer-ranks than the save (the policy is resharded on load; at the
same rank count the continuation is bit-identical).
Without --fresh the newest committed bundle that verifies is resumed (bundles without COMMIT are
ignored; a newer one that fails verification is skipped, reported on stderr and in --json as
skipped_bundles, and moved to _quarantine/ when the run saves its step again). --resume-step N
resumes exactly N, or fails.

SIGTERM saves and stops (--on-sigterm save, the default): the step in progress finishes, its
bundle commits within --grace-seconds and the run exits 0 with the step it saved; a second SIGTERM
or the grace period running out aborts that save cleanly (exit 143, the previous bundle stays the
resume point), and the process ends within --grace-seconds + 30 s whatever the storage does. A
SIGTERM during start-up stops it (exit 0, nothing new to save). SIGTERM may reach every process of
the job: the run's Ray processes leave it to this one. --save-by / --save-by-seconds end the run the
same way at a deadline. Ctrl-C stops at once (exit 130).
"""


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "train",
        help="run (or resume) the GRPO main job, saving a bundle every K steps",
        description=(
            "Train a tiny GRPO policy on CPU, data-parallel over --trainer-ranks ranks, with rollouts in "
            "TransferQueue on a private local Ray cluster (or --ray-address), saving policy, dataloader, "
            "replay index and data-plane snapshot as one transactional bundle every --save-every steps "
            "and at the last step."
        ),
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--run-dir",
        required=True,
        metavar="URL",
        help="where bundles go: a local path or an fsspec URL (s3://bucket/prefix)",
    )
    parser.add_argument(
        "--steps", type=_non_negative, default=8, metavar="N", help="train until N steps are done (default 8)"
    )
    parser.add_argument(
        "--save-every", type=_positive, default=2, metavar="K", help="save a bundle every K steps (default 2)"
    )
    parser.add_argument(
        "--mode",
        choices=("in_order", "async"),
        default="in_order",
        help="in_order: step k trains the groups generated with weights k (deterministic); async: bounded staleness",
    )
    parser.add_argument(
        "--max-staleness",
        type=_non_negative,
        default=1,
        metavar="S",
        help="async mode: generate with weights at most S steps old (default 1)",
    )
    parser.add_argument(
        "--storage-options",
        metavar="JSON",
        type=_common.storage_options_arg,
        default=None,
        help="fsspec options for the run dir's filesystem, as a JSON object",
    )
    start = parser.add_mutually_exclusive_group()
    start.add_argument(
        "--fresh", action="store_true", help="start from scratch (refused if the run dir already has committed bundles)"
    )
    start.add_argument(
        "--resume-step",
        type=_non_negative,
        default=None,
        metavar="N",
        help=(
            "resume exactly bundle N and fail if it does not verify (default: the newest bundle that "
            "verifies; newer ones that do not are skipped and reported)"
        ),
    )
    retention_args.add_retention_arguments(parser)
    tiers = parser.add_argument_group("two tiers (docs/tiers.md)")
    retention_args.add_replication_arguments(tiers)
    parser.add_argument(
        "--staging-dir",
        default=None,
        metavar="DIR",
        help="local staging for data-plane snapshots (default: /dev/shm when available)",
    )
    parser.add_argument(
        "--save-failure",
        choices=("stop", "continue"),
        default="stop",
        help="what a failed save does: stop the run (default) or log and go on",
    )
    parser.add_argument(
        "--upload-timing",
        choices=("pinned", "staged", "inline"),
        default="pinned",
        help="what the save window holds: only the replay-index capture, the captured rows copied after it "
        "(pinned, default); TransferQueue's snapshot, uploaded after the window (staged) or inside it (inline)",
    )
    parser.add_argument(
        "--sync-saves",
        action="store_true",
        help="the train pump waits for each whole save (default: only for policy staging and the window; "
        "the rest is written while training goes on, one save in flight at most)",
    )
    parser.add_argument(
        "--ray-temp-dir",
        default=None,
        metavar="DIR",
        help="where the private Ray cluster keeps sockets and logs (default: a new dir under /tmp, removed at exit)",
    )
    parser.add_argument(
        "--trainer-ranks",
        type=_positive,
        default=2,
        metavar="N",
        help="data-parallel trainer ranks: N Ray actors in one gloo group, policy sharded with FSDP2 (default 2)",
    )
    parser.add_argument(
        "--trainer-resources",
        metavar="JSON",
        type=_resources_arg,
        default=None,
        help="Ray custom resources each trainer rank asks for, as a JSON object (e.g. '{\"trainer_slot\": 1}')",
    )
    parser.add_argument(
        "--ray-address",
        type=_ray_address_arg,
        default=None,
        metavar="ADDR",
        help="join this existing Ray cluster (host:port) instead of starting a private local one",
    )
    parser.add_argument(
        "--ray-connect-timeout",
        type=_common.positive_seconds_arg,
        default=DEFAULT_RAY_CONNECT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"with --ray-address: give up when no Ray cluster answers there within SECONDS "
        f"(default {DEFAULT_RAY_CONNECT_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--signing-key",
        metavar="PATH",
        default=None,
        help=f"private key (signing.key, mode 0600) to sign every bundle with; also the resume's verify key "
        f"unless --verify-key is given (default: ${_common.SIGNING_KEY_ENV})",
    )
    _common.add_verify_key_argument(parser)
    parser.add_argument(
        "--compress",
        choices=("auto", "zstd", "none"),
        default="auto",
        help="data-plane files: zstd on object stores and plain on local disk (auto, default), or always zstd / never",
    )
    _common.add_compress_policy_argument(parser)
    _common.add_reuse_argument(parser)
    train_stop.add_stop_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line on stdout")
    _common.add_verbose_argument(parser)
    parser.set_defaults(func=run)


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None


def _positive(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _non_negative(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def _resources_arg(text: str) -> dict[str, float]:
    """--trainer-resources: a JSON object of Ray custom resource -> amount, checked as Ray would at once."""
    from rlckpt.controller.ranks.capacity import check_rank_resources
    from rlckpt.errors import ClusterConfigError

    try:
        return check_rank_resources(_common.json_object_arg(text))
    except ClusterConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _ray_address_arg(text: str) -> str:
    """--ray-address: host:port, checked before anything connects."""
    from rlckpt.errors import ClusterConfigError

    try:
        from rlckpt.dataplane.ray_cluster import split_address

        split_address(text)
    except ClusterConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _start_ray(args: argparse.Namespace) -> str | None:
    """Join --ray-address (at most --ray-connect-timeout to find it) or start the private local cluster.
    Returns the temp dir to remove at exit: the private cluster's, unless the user chose it with
    --ray-temp-dir. A start that fails leaves no temp dir of ours behind. A private cluster's processes
    leave SIGTERM to this one, and its reaper kills them (and removes our temp dir) however it ends."""
    from rlckpt.dataplane.ray_cluster import connect_ray, start_local_ray, stop_local_ray

    if args.ray_address:
        connect_ray(args.ray_address, timeout_s=args.ray_connect_timeout, log_to_driver=args.verbose > 0)
        return None
    ours = args.ray_temp_dir is None
    ray_dir = tempfile.mkdtemp(prefix="rlckpt-ray-", dir="/tmp") if ours else args.ray_temp_dir
    try:
        start_local_ray(ray_dir, log_to_driver=args.verbose > 0, remove_temp_dir=ours)
    except BaseException:
        stop_local_ray()  # whatever part of a cluster ray.init started before it failed
        if ours:
            shutil.rmtree(ray_dir, ignore_errors=True)
        raise
    return ray_dir if ours else None


def replication_line(event: dict[str, Any], remote: str) -> str | None:
    """The progress line of a replication event (None: the event is not one): one line, whatever failed."""
    if event.get("event") == "replicated":
        where = _common.printable(remote)
        return f"  replicated step {event['step']} to {where}: {event['lag_s']:.2f}s after its local commit"
    if event.get("event") == "replication_failed":
        return (
            f"  replication of step {event['step']} FAILED (retried with the next replicated save; the remote tier "
            f"is {event['lag_s']:.1f}s behind): {_common.printable(event['error'])}"
        )
    return None


@dataclass
class _Started:
    """What the driver has started so far: what its end stops, and what a report of a stop reads."""

    config: TrainConfig | None = None
    store: BundleStore | None = None
    ray: bool = False
    ray_dir: str | None = None  # ours, to remove
    controller: SingleController | None = None
    stopping: str = "preempted"  # why the run was stopping, should it end without its final save

    def known_last(self) -> int | None:
        """The newest step the run knows committed (its events; the restored step)."""
        return None if self.controller is None else self.controller.last_committed_step

    def shutdown(self) -> None:
        from rlckpt.dataplane.ray_cluster import stop_local_ray

        if self.controller is not None:
            self.controller.shutdown()
        if self.ray:
            stop_local_ray()
        if self.ray_dir is not None:  # ours: remove it; a user-given dir stays
            shutil.rmtree(self.ray_dir, ignore_errors=True)


def run(
    args: argparse.Namespace,
    *,
    before_commit: SaveHook | None = None,
    save_planner: SavePlannerFactory | None = None,
    before_generate: GenerateHook | None = None,
) -> int:
    """Run the main job; ``before_commit`` is awaited before each save's COMMIT, ``save_planner`` gives
    each trainer rank its DCP save planner and ``before_generate`` is awaited before each batch is
    generated (crash and stop tests; see setup_single_controller).

    The stop's state machine (``train_stop.StopState``) handles SIGTERM from the first line to the last:
    every phase of the run has one outcome per SIGTERM (docs/cli.md)."""
    started = _Started()
    stop = train_stop.StopState(args.on_sigterm, args.grace_seconds, on_overrun=_overrun(args, started))
    stop.install()
    outcome: StopOutcome | None = None
    unsaved: BaseException | None = None
    try:
        try:
            return _train(args, stop, started, before_commit, save_planner, before_generate)
        except FinalSaveAbortedError as exc:
            unsaved = exc
        except KeyboardInterrupt as exc:
            if not (stop.startup_stopped or stop.stopped_at_once):
                raise  # Ctrl-C: "interrupted", exit 130
            if stop.stopped_at_once:
                outcome = started.controller.stop_at_once() if started.controller else StopOutcome(None, None)
                if not (outcome.lost_nothing or stop.phase is train_stop.Phase.COMMITTED):
                    unsaved = exc
        finally:
            stop.enter(train_stop.Phase.SHUTTING_DOWN)
            started.shutdown()
        config, as_json = started.config, args.json
        run_dir = config.run_dir if config is not None else args.run_dir
        store = started.store
        if unsaved is not None:
            stop.outcome = _common.EXIT_TERMINATED
            return train_stop.report_unsaved(
                unsaved, store, run_dir, reason=started.stopping, known_last=started.known_last(), as_json=as_json
            )
        stop.outcome = _common.EXIT_OK
        step = None if outcome is None else outcome.step
        return train_stop.report_stopped(
            store, run_dir, reason=started.stopping, step=step, known_last=started.known_last(), as_json=as_json
        )
    finally:
        stop.uninstall()


def _train(
    args: argparse.Namespace,
    stop: train_stop.StopState,
    started: _Started,
    before_commit: SaveHook | None,
    save_planner: SavePlannerFactory | None,
    before_generate: GenerateHook | None,
) -> int:
    """The run, start-up to summary (``run`` handles how a stop ends it and stops what was started)."""
    from tqdm import tqdm

    from rlckpt.controller.config import TrainConfig
    from rlckpt.controller.setup import check_start, setup_single_controller

    signing_key = _common.signing_key(args)  # a key file that cannot be used: one line, exit 64, before anything
    verify_key = _common.verify_key(args) or (signing_key.public if signing_key else None)
    if verify_key is not None and signing_key is None:  # allowed (the key may be lost), but a trap: say so
        print(
            "rlckpt train: WARNING: a verify key and no signing key: the bundles this run saves are unsigned, "
            "and a resume with that verify key will not read them",
            file=sys.stderr,
        )
    try:
        config = TrainConfig(
            run_dir=args.run_dir,
            steps=args.steps,
            save_every=args.save_every,
            rollout_order=args.mode,
            max_staleness=args.max_staleness,
            fresh=args.fresh,
            resume_step=args.resume_step,
            storage_options=args.storage_options,
            **retention_args.retention_fields(args),
            **retention_args.metric_fields(args),
            replicate_to=args.replicate_to,
            replicate_storage_options=args.replicate_storage_options,
            replicate_every=args.replicate_every,
            **retention_args.retention_fields(args, prefix="replica-"),
            staging_dir=args.staging_dir,
            save_failure=args.save_failure,
            upload_timing=args.upload_timing,
            async_saves=not args.sync_saves,
            compress_data_plane={"auto": None, "zstd": True, "none": False}[args.compress],
            compress_policy=args.compress_policy,
            reuse_unchanged=args.reuse_unchanged,
            trainer_ranks=args.trainer_ranks,
            trainer_resources=args.trainer_resources,
            save_by=args.save_by,
            grace_s=args.grace_seconds,
            signing_key=signing_key,
            verify_key=verify_key,
            run_id=_common.run_id(args),
        )
    except ValueError as exc:  # flags argparse cannot check one by one (--metric without --keep-best, ...)
        print(f"rlckpt train: error: {_common.printable(exc)} (see rlckpt train --help)", file=sys.stderr)
        return _common.EXIT_USAGE
    started.config, started.store = config, config.store()  # the store a stop's report lists
    check_start(config)  # a wrong --resume-step or --fresh fails here, before Ray and TQ take ≈20 s to start
    started.ray_dir = _start_ray(args)
    started.ray = True
    print("rlckpt train: starting TransferQueue and the controller ...", file=sys.stderr)
    controller = started.controller = setup_single_controller(
        config, before_commit=before_commit, save_planner=save_planner, before_generate=before_generate
    )
    stop.enter(train_stop.Phase.TRAINING)  # from here a first SIGTERM is a save-and-stop
    start = controller.restored.step if controller.restored else 0
    skipped = controller.restored.skipped if controller.restored else []
    for bundle in skipped:
        print(
            f"rlckpt train: SKIPPED step {bundle.step}: it does not verify ({_common.printable(bundle.reason)})",
            file=sys.stderr,
        )
    if controller.restored:
        print(
            f"rlckpt train: resumed step {start} from {_common.printable(controller.restored.url)} "
            f"({controller.restored.seconds:.1f}s): {_common.printable(controller.restored.why)}",
            file=sys.stderr,
        )
    bar = tqdm(total=config.steps, initial=start, desc="train", unit="step", file=sys.stderr, dynamic_ncols=True)

    def on_event(event: dict[str, Any]) -> None:
        stop_line = train_stop.describe_event(event)
        if stop_line is not None:
            started.stopping = event.get("reason", started.stopping)
            bar.write(stop_line, file=sys.stderr)
        if event.get("event") == "stop_committed":
            stop.enter(train_stop.Phase.COMMITTED)
        if event.get("event") == "step":
            bar.update(event["step"] - bar.n)
            bar.set_postfix(reward=f"{event['reward']:.3f}")
        if "saved" in event:
            downtime = f", train pump waited {event['save_downtime_s']:.2f}s" if "save_downtime_s" in event else ""
            bar.write(
                f"  saved step {event['saved']}: {event['save_s']:.2f}s{downtime}, "
                f"window {event['window_s'] * 1e3:.1f} ms, max rollout stall {event['stall_max_s'] * 1e3:.1f} ms",
                file=sys.stderr,
            )
        elif (replication := replication_line(event, str(config.replicate_to))) is not None:
            bar.write(replication, file=sys.stderr)
        elif "save_error" in event:
            bar.write(f"  save of step {event['step']} FAILED: {event['save_error']}", file=sys.stderr)

    summary = controller.run(on_event, stop_request=stop.pending)
    stop.enter(train_stop.Phase.SHUTTING_DOWN)  # the outcome is the summary's: a SIGTERM from now is ignored
    bar.close()
    bundles = controller.store.steps()
    record = controller.store.run_record()
    run_id = record.run_id if record else None
    result = {
        **asdict(summary),
        "bundles": bundles,
        "run_dir": config.run_dir,
        "rollout_order": config.rollout_order,
        "skipped_bundles": [asdict(bundle) for bundle in skipped],
        "restored_from": controller.restored.url if controller is not None and controller.restored else None,
        "final_save_aborted": False,
        "run_id": run_id,
        "signing_key_id": signing_key.key_id if signing_key else None,  # its id: never the key itself
    }
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        reward = "-" if summary.reward is None else f"{summary.reward:.3f}"
        print(
            f"step {summary.step}  reward {reward}  policy_sha256 {summary.policy_sha256[:16]}…  "
            f"bundles {bundles}  ({summary.steps_run} steps this run, resumed from {summary.resumed_from})  "
            f"run {run_id}"
        )
    if summary.stop_reason != "completed":
        last = summary.last_committed_step
        line = train_stop.stopped_line(summary.stop_reason, last, trained=summary.steps_run > 0, step=summary.step)
        print(line, file=sys.stderr)
    stop.outcome = _common.EXIT_OK
    return _common.EXIT_OK


def _overrun(args: argparse.Namespace, started: _Started) -> Callable[[int], None]:
    """The backstop of a stop that overran its bound: one line, the ``--json`` line with what the run
    knows (nothing is listed: the store may be what hangs), and the exit, now."""

    def overrun(code: int) -> None:
        last = started.known_last()
        print(
            f"rlckpt train: the stop did not end within the grace period + {train_stop.STOP_MARGIN_S:.0f}s: "
            f"exiting now; resume point: {last}",
            file=sys.stderr,
            flush=True,
        )
        if args.json:
            record = {
                "step": train_stop.standing_at(None, last),
                "stop_reason": started.stopping,
                "final_save_aborted": code != _common.EXIT_OK,
                "last_committed_step": last,
                "bundles": None,
                "run_dir": args.run_dir,
            }
            print(json.dumps(record, sort_keys=True), flush=True)
        os._exit(code)

    return overrun
