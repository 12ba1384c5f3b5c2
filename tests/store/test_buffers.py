"""BufferPool: read buffers reused from load to load, with what stays idle bounded."""

from __future__ import annotations

from rlckpt.store import BufferPool
from rlckpt.store.io.buffers import SIZE_STEP

MiB = 1 << 20


def test_a_buffer_given_back_is_lent_again_for_a_read_it_fits():
    pool = BufferPool(max_idle=8 * MiB)
    first = pool.take(3 * MiB)
    pool.give(first)
    assert pool.take(2 * MiB) is first


def test_the_smallest_idle_buffer_that_fits_is_lent():
    pool = BufferPool(max_idle=8 * MiB)
    big, small = pool.take(4 * MiB), pool.take(2 * MiB)
    pool.give(big)
    pool.give(small)
    assert pool.take(1 * MiB) is small


def test_a_buffer_above_the_idle_bound_is_kept_for_the_next_read_that_large():
    """One item bigger than the bound is read alone; the next such item reuses its buffer (no page faults)."""
    pool = BufferPool(max_idle=8 * MiB)
    large = pool.take(20 * MiB)
    pool.give(large)
    assert pool.take(20 * MiB) is large


def test_only_the_newest_buffer_above_the_bound_stays_idle():
    pool = BufferPool(max_idle=8 * MiB)
    older, newer = pool.take(20 * MiB), pool.take(30 * MiB)
    pool.give(older)
    pool.give(newer)
    assert pool.idle_bytes == 30 * MiB
    assert pool.take(10 * MiB) is newer


def test_what_stays_idle_after_reads_of_many_sizes_is_the_bound_plus_one_large_buffer():
    pool = BufferPool(max_idle=8 * MiB)
    for mib in (1, 3, 5, 7, 2, 40, 6, 25, 4, 1):  # 94 MiB read in all
        pool.give(pool.take(mib * MiB))
    assert pool.idle_bytes <= 8 * MiB + 40 * MiB  # the 25 MiB read reused the 40 MiB buffer


def test_sizes_are_rounded_up_so_reads_of_about_one_size_share_a_buffer():
    pool = BufferPool(max_idle=8 * MiB)
    first = pool.take(SIZE_STEP + 1)
    assert len(first) == 2 * SIZE_STEP
    pool.give(first)
    assert pool.take(2 * SIZE_STEP - 5) is first


def test_reused_counts_the_takes_an_idle_buffer_served_and_no_others():
    pool = BufferPool()
    first = pool.take(3 * SIZE_STEP)
    pool.take(3 * SIZE_STEP)  # nothing idle yet: a new one
    pool.give(first)
    pool.take(2 * SIZE_STEP)  # the idle one fits
    pool.take(5 * SIZE_STEP)  # nothing idle fits
    assert pool.reused == 1
