"""The population's shared directory, read and written through tf.io.gfile
(a local disk, NFS, or a bucket: `gs://...`), so that members on several
hosts need nothing but that path in common.

    <population_dir>/population.json        the population's settings
    <population_dir>/members/<k>.json       member k's record (rewritten)
    <population_dir>/lineage/<time>_<k>.json one file per evolution

Every file is written whole: to a temporary name, then renamed over its
own (on a bucket a rename is a copy then a delete; the copy is whole). A
reader never sees half a record, and a kill at any moment leaves the last
whole one. The lineage is appended one file per event, so nothing is ever
rewritten, and survives any kill; read back in order of its names.
"""

from __future__ import annotations

import datetime
import json
import posixpath
import uuid

import tensorflow as tf

POPULATION_FILE = "population.json"
MEMBERS_DIR = "members"
LINEAGE_DIR = "lineage"


def write_json(path: str, value) -> None:
    """Writes `value` as JSON to `path` whole (a temporary file renamed)."""
    directory = posixpath.dirname(path)
    if directory:
        tf.io.gfile.makedirs(directory)
    temporary = f"{path}.tmp-{uuid.uuid4().hex}"
    with tf.io.gfile.GFile(temporary, "w") as f:
        f.write(json.dumps(value, indent=1, sort_keys=True) + "\n")
    tf.io.gfile.rename(temporary, path, overwrite=True)


def read_json(path: str):
    """The JSON at `path`; None when there is none. ValueError (naming the
    file) when it is not JSON."""
    if not tf.io.gfile.exists(path):
        return None
    with tf.io.gfile.GFile(path) as f:
        text = f.read()
    try:
        return json.loads(text)
    except ValueError:
        raise ValueError(f"{path} is not valid JSON") from None


def member_path(population_dir: str, member: int) -> str:
    return posixpath.join(population_dir, MEMBERS_DIR, f"{member}.json")


def write_member(population_dir: str, member: int, record: dict) -> None:
    write_json(member_path(population_dir, member), record)


def read_member(population_dir: str, member: int) -> dict | None:
    return read_json(member_path(population_dir, member))


def read_members(population_dir: str) -> dict[int, dict]:
    """Every member's record there is, {member: record}; a record that
    cannot be read (being replaced on a store without atomic renames) is
    left out this time."""
    directory = posixpath.join(population_dir, MEMBERS_DIR)
    if not tf.io.gfile.isdir(directory):
        return {}
    members = {}
    for name in tf.io.gfile.listdir(directory):
        if not name.endswith(".json") or not name[:-5].isdigit():
            continue
        try:
            record = read_json(posixpath.join(directory, name))
        except (ValueError, tf.errors.NotFoundError):
            continue
        if record is not None:
            members[int(name[:-5])] = record
    return members


def append_lineage(population_dir: str, event: dict) -> str:
    """Adds one evolution to the lineage (its own file, written whole);
    returns its path."""
    now = datetime.datetime.now(datetime.UTC)
    name = (
        f"{now.strftime('%Y%m%dT%H%M%S.%fZ')}_{event['member']}_{event['frames']}.json"
    )
    path = posixpath.join(population_dir, LINEAGE_DIR, name)
    write_json(path, dict(event, time=now.isoformat()))
    return path


def read_lineage(population_dir: str) -> list[dict]:
    """Every evolution so far, oldest first."""
    directory = posixpath.join(population_dir, LINEAGE_DIR)
    if not tf.io.gfile.isdir(directory):
        return []
    events = []
    for name in sorted(tf.io.gfile.listdir(directory)):
        if name.endswith(".json"):
            event = read_json(posixpath.join(directory, name))
            if event is not None:
                events.append(event)
    return events
