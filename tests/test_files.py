"""The one way a file is written (serving/files.py): whole or not at all, never through a link
planted in a folder the user did not name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from groundcover.serving.files import (
    UnsafePath,
    atomic_file,
    make_dirs,
    open_unlinked,
    write_atomic,
)


def test_written_whole_and_replaced(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    write_atomic(target, "one")
    write_atomic(target, b"two")
    assert target.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]  # no temporary file left


def test_a_failed_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "out.txt"
    write_atomic(target, "old")
    with pytest.raises(RuntimeError), atomic_file(target) as handle:
        handle.write("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_a_planted_temporary_link_is_never_followed(tmp_path: Path) -> None:
    """The old writers opened OUT.tmp, following a link a sender planted there."""
    victim = tmp_path / "bashrc"
    victim.write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    (run / "report.html.tmp").symlink_to(victim)
    write_atomic(run / "report.html", "<page>", within=run)
    assert victim.read_text() == "mine"
    assert (run / "report.html").read_text() == "<page>"


def test_a_linked_target_or_folder_inside_a_run_is_refused(tmp_path: Path) -> None:
    victim_dir = tmp_path / "elsewhere"
    victim_dir.mkdir()
    victim = victim_dir / "queue.jsonl"
    victim.write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    (run / "labels").symlink_to(victim_dir)
    with pytest.raises(UnsafePath, match="symbolic link"):
        write_atomic(run / "labels" / "queue.jsonl", "x", within=run)
    (run / "page.html").symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        write_atomic(run / "page.html", "x", within=run)
    with pytest.raises(UnsafePath, match="symbolic link"):
        make_dirs(run / "labels" / "more", within=run)
    with pytest.raises(UnsafePath, match="leaves"):
        write_atomic(run / ".." / "x", "x", within=run)
    assert victim.read_text() == "mine"
    assert sorted(p.name for p in victim_dir.iterdir()) == ["queue.jsonl"]


def test_a_path_the_user_named_is_followed(tmp_path: Path) -> None:
    """A user's home that is a link (clusters): the path they typed is theirs."""
    real = tmp_path / "real"
    real.mkdir()
    home = tmp_path / "home"
    home.symlink_to(real)
    write_atomic(home / "out.csv", "a,b\n")
    assert (real / "out.csv").read_text() == "a,b\n"
    (home / "latest.csv").symlink_to(real / "out.csv")
    write_atomic(home / "latest.csv", "c\n")  # a link they named: written where it points
    assert (real / "out.csv").read_text() == "c\n"
    assert (home / "latest.csv").is_symlink()


def test_permissions_follow_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "secret", "k", permissions=0o600)
        write_atomic(tmp_path / "open", "k")
    finally:
        os.umask(old)
    assert (tmp_path / "secret").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "open").stat().st_mode & 0o777 == 0o644


def test_an_append_never_opens_a_link(tmp_path: Path) -> None:
    """Appends (a run's results, people's labels) open their file without following a link:
    a sent run's ``results.jsonl -> ~/.bashrc`` is refused, never appended to or truncated."""
    victim = tmp_path / "bashrc"
    victim.write_text("mine")
    run = tmp_path / "run"
    run.mkdir()
    (run / "results.jsonl").symlink_to(victim)
    append = os.O_WRONLY | os.O_APPEND | os.O_CREAT
    with pytest.raises(UnsafePath, match="symbolic link"):
        open_unlinked(run / "results.jsonl", append, within=run)
    with pytest.raises(UnsafePath, match="symbolic link"):
        open_unlinked(run / "results.jsonl", os.O_RDWR, within=run)
    (run / "labels").symlink_to(tmp_path)
    with pytest.raises(UnsafePath, match="symbolic link"):
        open_unlinked(run / "labels" / "bashrc", append, within=run)
    fd = open_unlinked(run / "own.jsonl", append, within=run)
    os.write(fd, b"{}\n")
    os.close(fd)
    assert victim.read_text() == "mine" and (run / "own.jsonl").read_text() == "{}\n"


def test_a_folder_swapped_for_a_link_while_writing_is_not_written_through(tmp_path: Path) -> None:
    """The folders are opened one by one without following a link and the file is made and
    renamed relative to the last one: a link swapped in after the check redirects nothing."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    (run / "labels").mkdir(parents=True)
    with atomic_file(run / "labels" / "queue.jsonl", within=run) as handle:
        (run / "labels").rename(run / "moved")
        (run / "labels").symlink_to(elsewhere)
        handle.write("queue\n")
    assert not list(elsewhere.iterdir())
    assert (run / "moved" / "queue.jsonl").read_text() == "queue\n"


def test_folders_below_a_root_not_made_yet_are_made_with_it(tmp_path: Path) -> None:
    """A run directory not made yet (a framework scored from Python): its folders are made as
    they were before writes went through here, still refusing a link below it."""
    run = tmp_path / "not" / "yet"
    make_dirs(run / "graphs", within=run)
    write_atomic(run / "graphs" / "q.json", "{}", within=run)
    assert (run / "graphs" / "q.json").read_text() == "{}"
