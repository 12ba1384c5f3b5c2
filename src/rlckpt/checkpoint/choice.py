"""Which committed bundle a resume takes: the newest that verifies on any tier of the run, or a pinned step.

Shared by every reader of a run (``restore_run`` for `rlckpt train`, ``rlckpt.checkpointer`` for trainers
rlckpt does not own): the tiers are listed once, the candidates tried newest first (on a tie, in the tiers'
order: the local tier's copy first), and a candidate that does not verify is skipped loudly (logged, and
returned in ``Choice.skipped``) before the next older one is tried. What "verifies" means beyond the store's
own checks (marker, manifest digest, signature, listing) is the caller's ``check``: `rlckpt train` fetches
and pairs its pieces, the Checkpointer reads every digest. A pinned step is that step or an error, never
another one. No torch, Ray or TransferQueue here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from rlckpt.errors import CheckpointError, CorruptBundleError, NewerFormatError, UncommittedBundleError
from rlckpt.store import Bundle, BundleStore, StoreEntry

logger = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(frozen=True)
class SkippedBundle:
    """A committed bundle newer than the one resumed, passed over because it does not verify."""

    step: int
    reason: str
    url: str = ""  # the tier it is on


@dataclass(frozen=True)
class Candidate:
    """A step-like entry of one tier that a resume may try: the tier's store, its rank among the tiers (0:
    preferred on a tie) and the entry."""

    store: BundleStore
    tier: int
    entry: StoreEntry


@dataclass(frozen=True)
class Choice(Generic[T]):
    """The bundle a resume takes: where it is, what the caller's check made of it, the newer bundles skipped
    on the way and why this tier's copy (one line)."""

    candidate: Candidate
    checked: T
    skipped: list[SkippedBundle] = field(default_factory=list)
    why: str = ""

    @property
    def store(self) -> BundleStore:
        return self.candidate.store

    @property
    def step(self) -> int:
        return self.candidate.entry.step


def as_tiers(stores: BundleStore | Sequence[BundleStore]) -> list[BundleStore]:
    """One store, or the tiers in order of preference, as a list (ValueError when empty)."""
    tiers = [stores] if isinstance(stores, BundleStore) else list(stores)
    if not tiers:
        raise ValueError("a resume needs at least one store")
    return tiers


def list_tiers(tiers: Sequence[BundleStore]) -> list[list[StoreEntry]]:
    """Every tier's entries (one listing each). Raises StoreUnavailableError when a tier cannot be reached."""
    return [store.entries() for store in tiers]


def candidates(tiers: Sequence[BundleStore], listed: Sequence[list[StoreEntry]]) -> list[Candidate]:
    """Every entry a resume may try, newest first and, for one step, in the tiers' order."""
    found = [
        Candidate(store, tier, entry)
        for tier, (store, entries) in enumerate(zip(tiers, listed, strict=True))
        for entry in entries
        if entry.state in ("committed", "corrupt", "newer")
    ]
    return sorted(found, key=lambda c: (-c.entry.step, c.tier))


def choose(
    tiers: Sequence[BundleStore],
    check: Callable[[Bundle], T],
    *,
    listed: Sequence[list[StoreEntry]] | None = None,
    resume_step: int | None = None,
    accept: Callable[[Bundle], object] = lambda bundle: None,
) -> Choice[T] | None:
    """The newest bundle on any tier that opens and passes `check`, or `resume_step` exactly; None when no tier
    holds a committed (or corrupt, or newer) bundle at all and no step is pinned: a fresh start.

    Args:
        tiers: the run's stores in order of preference (the first tier's copy is taken on a tie).
        check: the caller's verification of an opened bundle (it raises CorruptBundleError when the bundle
            does not verify); its result is returned in ``Choice.checked``.
        listed: each tier's entries when the caller listed them already.
        resume_step: take exactly this step, from the first tier where it verifies, or fail.
        accept: with `resume_step`, what the manifest alone must pass for the step to be tried (e.g. that it
            is a bundle of the caller's kind), right after it opens: it raises to refuse it.
    Raises:
        CheckpointError: no committed bundle verifies (every one was skipped); or `resume_step` does not
            verify, is not committed, or newer committed bundles exist that the resumed run would save over.
        NewerFormatError: the newest bundle is of a store format this rlckpt does not read: nothing older is
            tried (resuming it would save over the newer one). And what `check` raises besides
            CorruptBundleError (e.g. a format error of the caller's), at once.
        StoreUnavailableError: a tier cannot be reached.
    """
    listed = list_tiers(tiers) if listed is None else listed
    if resume_step is not None:
        return _pinned(tiers, listed, resume_step, check, accept)
    found = candidates(tiers, listed)
    if not found:
        return None
    skipped: list[SkippedBundle] = []
    for candidate in found:
        entry, store = candidate.entry, candidate.store
        try:
            if entry.state == "corrupt":
                raise CorruptBundleError(entry.detail)
            if entry.state == "newer":  # resuming an older bundle instead would save over this one
                raise NewerFormatError(entry.detail)
            checked = check(store.open(entry.step))
        except CorruptBundleError as exc:
            logger.warning(
                "SKIPPING step %d at %s: it does not verify (%s); trying an older bundle", entry.step, store.url, exc
            )
            skipped.append(SkippedBundle(entry.step, str(exc), store.url))
            continue
        return Choice(candidate, checked, skipped, why(candidate, tiers, listed, None))
    reasons = "; ".join(f"step {s.step}: {s.reason}" for s in skipped)
    where = " or ".join(store.url for store in tiers)
    raise CheckpointError(
        f"no committed bundle at {where} verifies ({reasons}); nothing was restored. Move the bundles "
        "aside (or use a new run dir) to start over"
    )


def openings(
    tiers: Sequence[BundleStore],
    step: int,
    listed: Sequence[list[StoreEntry]] | None = None,
    accept: Callable[[Bundle], object] = lambda bundle: None,
) -> list[tuple[int, Bundle]]:
    """(tier, opened bundle) of `step` on every tier where it opens (marker → manifest digest → listing) and
    passes `accept`, in the tiers' order: the checks of a pinned resume that read no data file.

    Raises:
        CheckpointError: a newer committed bundle on any tier (the resumed run would save over its step), or
            the step opens nowhere (naming the step, the stores and why).
    """
    listed = list_tiers(tiers) if listed is None else listed
    for store, entries in zip(tiers, listed, strict=True):
        newer = [e.step for e in entries if e.step > step and e.state in ("committed", "newer")]
        if newer:
            raise CheckpointError(
                f"cannot resume step {step} at {store.url}: newer committed bundles {newer} exist, and the resumed "
                "run would save over their steps; move them aside or resume in a new run dir"
            )
    opened: list[tuple[int, Bundle]] = []
    problems: list[Exception] = []
    for tier, store in enumerate(tiers):
        try:
            bundle = store.open(step)
            accept(bundle)
        except UncommittedBundleError as exc:
            if len(tiers) == 1:
                problems.append(exc)
            continue
        except CorruptBundleError as exc:
            problems.append(exc)
            continue
        opened.append((tier, bundle))
    if not opened:
        cause = problems[0] if problems else UncommittedBundleError(f"step {step} is on no tier")
        raise does_not_verify(tiers, step, cause) from cause
    return opened


def _pinned(
    tiers: Sequence[BundleStore],
    listed: Sequence[list[StoreEntry]],
    step: int,
    check: Callable[[Bundle], T],
    accept: Callable[[Bundle], object],
) -> Choice[T]:
    """`resume_step`: that step, from the first tier where it verifies, or an error, never another step."""
    problems: list[Exception] = []
    for tier, bundle in openings(tiers, step, listed, accept):
        try:
            checked = check(bundle)
        except (CorruptBundleError, UncommittedBundleError) as exc:
            problems.append(exc)
            continue
        entry = next(e for e in listed[tier] if e.step == step)
        candidate = Candidate(tiers[tier], tier, entry)
        return Choice(candidate, checked, [], why(candidate, tiers, listed, step))
    raise does_not_verify(tiers, step, problems[0]) from problems[0]


def does_not_verify(tiers: Sequence[BundleStore], step: int, cause: Exception) -> CheckpointError:
    where = " or ".join(store.url for store in tiers)
    return CheckpointError(f"cannot resume step {step} at {where}: it does not verify ({cause})")


def why(chosen: Candidate, tiers: Sequence[BundleStore], listed: Sequence[list[StoreEntry]], pinned: int | None) -> str:
    """Why this tier's bundle is the one resumed, in a line: what every other tier holds."""
    if len(tiers) == 1:
        return "the step asked for" if pinned is not None else "the newest bundle that verifies"
    step = chosen.entry.step
    others = []
    for tier, (store, entries) in enumerate(zip(tiers, listed, strict=True)):
        if tier == chosen.tier:
            continue
        held = [e.step for e in entries if e.state == "committed"]
        if step in held and tier < chosen.tier:
            others.append(f"{store.url} holds it too but its copy does not verify")
        elif step in held:
            others.append(f"{store.url} holds it too (the first tier's copy is read on a tie)")
        else:
            others.append(f"{store.url} holds {f'up to step {max(held)}' if held else 'no committed bundle'}")
    what = "the step asked for" if pinned is not None else "the newest bundle that verifies on any tier"
    return f"{what}; " + "; ".join(others)
