"""What the sensor keeps after its programs are unloaded: the counting maps' final snapshot,
which the last metrics export reads (no BPF here: the snapshot is plain data)."""

from __future__ import annotations

import ctypes

from otelbpf.sensor.sensor import Sensor, SensorOptions


class _Key(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint32), ("qpn", ctypes.c_uint32)]


def test_keys_forgotten_after_the_unload_leave_the_final_snapshot():
    """An export racing the stop reads the snapshot and forgets what it exported; the final
    export must not find those counters again (they went out once, as series of a QP its
    correlator had since forgotten: attribute-less duplicates)."""
    sensor = Sensor(SensorOptions([]), lambda ring, arr: None)
    a, b = _Key(7, 420), _Key(7, 421)
    sensor._final = {"ibv_retired": [(a, 25), (b, 3)]}
    entries = sensor.read_map("ibv_retired")
    sensor.delete_keys("ibv_retired", [k for k, _v in entries if k.qpn == 420])
    assert [(k.qpn, v) for k, v in sensor.read_map("ibv_retired")] == [(421, 3)]
    sensor.delete_keys("ibv_retired", [_Key(7, 421)])  # an equal key, not the same object
    assert sensor.read_map("ibv_retired") == []
    sensor.delete_keys("never_read", [a])  # a map without a snapshot: nothing to forget
    assert sensor.read_map("never_read") == []
