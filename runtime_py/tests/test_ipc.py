"""Frame encoding: 4-byte big-endian length + UTF-8 JSON."""

from __future__ import annotations

import json
import os
import socket
import struct

from kcoral_runtime.ipc import (
    FrameDecoder, FrameSocket, OutQueue, dumps, encode, frame_with_suffix, split_tail,
)


def test_encode_is_compact_utf8_with_big_endian_length() -> None:
    data = encode({"t": "x", "s": "é"})
    payload = '{"t":"x","s":"é"}'.encode("utf-8")
    assert data == struct.pack(">I", len(payload)) + payload


def test_lone_surrogates_fall_back_to_escapes() -> None:
    data = encode({"m": "bad\udc80"})
    assert json.loads(data[4:]) == {"m": "bad\udc80"}
    assert data[4:].isascii()


def test_decoder_handles_split_and_merged_frames() -> None:
    stream = encode({"a": 1}) + encode({"b": "x" * 100000}) + encode({"c": []})
    decoder = FrameDecoder()
    out = []
    for i in range(0, len(stream), 7):
        out.extend(decoder.feed(stream[i : i + 7]))
    assert [json.loads(p) for p in out] == [{"a": 1}, {"b": "x" * 100000}, {"c": []}]
    assert decoder.pending == 0
    assert [json.loads(p) for p in FrameDecoder().feed(stream)] == [json.loads(p) for p in out]


def test_out_queue_survives_a_full_pipe() -> None:
    r, w = os.pipe()
    os.set_blocking(w, False)
    queue = OutQueue()
    big = os.urandom(1 << 20)
    queue.push(big)
    queue.push(b"end")
    queue.write_to(w)
    assert queue  # the pipe could not take 1 MiB at once
    got = bytearray()
    while queue or len(got) < len(big) + 3:
        got += os.read(r, 1 << 16)
        queue.write_to(w)
    assert bytes(got) == big + b"end"
    os.close(r)
    os.close(w)


def test_frame_socket_round_trip() -> None:
    a, b = socket.socketpair()
    left, right = FrameSocket(a), FrameSocket(b)
    left.send({"t": "run", "req": {"x": [1, 2]}})
    left.send_raw(b'{"t":"instr","i":3}')
    assert right.recv() == {"t": "run", "req": {"x": [1, 2]}}
    assert right.recv() == {"t": "instr", "i": 3}
    a.close()
    assert right.recv() is None
    b.close()


def test_a_frames_tail_travels_as_its_own_bytes() -> None:
    # The program JSON text follows its frame's JSON after a NUL byte, not escaped into it.
    program = b'{"instructions":[{"op":"call","source":"print(\\"\\u00e9\\")\\n"}]}\x00\xff'
    data = encode({"t": "run", "req": {"x": 1}}, program)
    assert data.count(b"\\\\") == 0 and program in data
    (payload,) = FrameDecoder().feed(data)
    assert split_tail(payload) == (b'{"t":"run","req":{"x":1}}', program)
    assert split_tail(b'{"t":"x"}') == (b'{"t":"x"}', None)
    a, b = socket.socketpair()
    FrameSocket(a).send_raw(payload)
    FrameSocket(a).send({"t": "lease", "a": "granted"})
    right = FrameSocket(b)
    assert right.recv_with_tail() == ({"t": "run", "req": {"x": 1}}, program)
    assert right.recv_with_tail() == ({"t": "lease", "a": "granted"}, None)
    a.close()
    assert right.recv_with_tail() == (None, None)
    b.close()


def test_frame_with_suffix_overrides_the_payloads_own_members() -> None:
    # A child's frame naming another child (and posing as the zygote) is tagged last: its own
    # "c" and "child" lose to the tag (JSON keeps the last of duplicate keys).
    payload = dumps({"t": "exited", "c": 99, "child": False, "x": [1, {"c": 5}]})
    out = FrameDecoder().feed(frame_with_suffix(payload, b',"c":3,"child":true}'))
    assert [json.loads(p) for p in out] == [{"t": "exited", "c": 3, "child": True, "x": [1, {"c": 5}]}]
