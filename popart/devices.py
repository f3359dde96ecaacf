"""Devices: ``DeviceManager`` creates the CPU and IPU-Model devices that sessions run on, and
refuses to hand out IPU hardware on a machine that has none (no silent fallback).

Setting the environment variable ``POPXL_IPU_HW=cpu`` (shared with popxl) makes the acquire
methods return a device that runs IPU programs on the CPU engine instead, for scripts that insist
on acquiring hardware."""
from __future__ import annotations

import itertools
import os
from enum import Enum
from typing import Any, Dict, List, Literal, Mapping, Optional

from popart.errors import popart_exception

__all__ = ["DeviceType", "DeviceConnectionType", "SyncPattern", "DeviceSelectionCriterion", "DeviceInfo",
           "DeviceManager"]

IPU_HW_ENV = "POPXL_IPU_HW"


class DeviceType(Enum):
    IpuModel = 0
    Cpu = 1
    Ipu = 2
    OfflineIpu = 3
    Sim = 4


class DeviceConnectionType(Enum):
    """When an acquired device attaches: at once (Always), when first needed (OnDemand), or never."""
    Always = 0
    OnDemand = 1
    Never = 2


class SyncPattern(Enum):
    Full = 0
    SinglePipeline = 1
    ReplicaAndLadder = 2


class DeviceSelectionCriterion(Enum):
    First = 0
    Random = 1


_ids = itertools.count()


class DeviceInfo:
    """One device a session can run on. ``numIpus`` bounds replication: a session with
    ``replicatedGraphCount`` r needs at least r IPUs (a CPU device has one)."""

    def __init__(self, type: DeviceType, numIpus: int = 1, tilesPerIpu: int = 1472, version: str = "ipu2",
                 connectionType: DeviceConnectionType = DeviceConnectionType.Always,
                 options: Optional[Mapping[str, Any]] = None) -> None:
        self._type = type
        self._num_ipus = int(numIpus)
        self._tiles = int(tilesPerIpu)
        self._version = version
        self._connection = connectionType
        self._options = dict(options or {})
        self._id = next(_ids)
        self._attached = connectionType is DeviceConnectionType.Always

    # PopART exposes these as read-only properties.
    @property
    def id(self) -> int:
        return self._id

    @property
    def type(self) -> DeviceType:
        return self._type

    @property
    def numIpus(self) -> int:
        return self._num_ipus

    @property
    def tilesPerIpu(self) -> int:
        return self._tiles

    @property
    def driverIds(self) -> List[int]:
        return []

    @property
    def version(self) -> str:
        return self._version

    @property
    def connectionType(self) -> DeviceConnectionType:
        return self._connection

    @property
    def isAttached(self) -> bool:
        return self._attached

    def attach(self) -> bool:
        if self._connection is DeviceConnectionType.Never:
            raise popart_exception(f"{self!r} was acquired with DeviceConnectionType.Never and cannot attach.")
        self._attached = True
        return True

    def tryAttachUntilTimeout(self) -> bool:
        return self.attach()

    def detach(self) -> None:
        self._attached = False

    def getOptions(self) -> Dict[str, Any]:
        return dict(self._options)

    @property
    def _popxl_device(self) -> Literal["cpu", "ipu_model"]:
        """The popxl engine device this runs on: the CPU device is popxl's 'cpu', everything else
        (IPU Model, or hardware emulated under POPXL_IPU_HW=cpu) is 'ipu_model'."""
        return "cpu" if self._type is DeviceType.Cpu else "ipu_model"

    def __repr__(self) -> str:
        return (f"DeviceInfo(id={self._id}, type={self._type.name}, numIpus={self._num_ipus}, "
                f"tilesPerIpu={self._tiles})")

    def __str__(self) -> str:
        return self.__repr__()


_MODEL_OPTIONS = {"numIPUs", "tilesPerIPU", "ipuVersion", "compileIPUCode", "memoryPerTile"}


def _hw_on_cpu() -> bool:
    return os.environ.get(IPU_HW_ENV, "").lower() == "cpu"


class DeviceManager:
    """Creates and acquires devices. There is no IPU hardware here: ``enumerateDevices`` is empty
    and acquiring hardware raises, unless ``POPXL_IPU_HW=cpu`` is set."""

    def createCpuDevice(self) -> DeviceInfo:
        """A single-IPU device that runs on the host CPU."""
        return DeviceInfo(DeviceType.Cpu, numIpus=1, tilesPerIpu=1, version="cpu")

    def createIpuModelDevice(self, options: Optional[Mapping[str, Any]] = None) -> DeviceInfo:
        """A software model of ``numIPUs`` IPUs (default 1), running on the host CPU."""
        options = dict(options or {})
        unknown = sorted(set(options) - _MODEL_OPTIONS)
        if unknown:
            raise popart_exception(f"createIpuModelDevice: unknown option(s) {unknown}; known options are "
                                   f"{sorted(_MODEL_OPTIONS)}.")
        num = int(options.get("numIPUs", 1))
        tiles = int(options.get("tilesPerIPU", 1472))
        if num < 1 or tiles < 1:
            raise popart_exception(f"createIpuModelDevice: numIPUs and tilesPerIPU must be >= 1, got {options}.")
        return DeviceInfo(DeviceType.IpuModel, numIpus=num, tilesPerIpu=tiles,
                          version=str(options.get("ipuVersion", "ipu2")), options=options)

    def createSimDevice(self, options: Optional[Mapping[str, Any]] = None) -> DeviceInfo:
        raise popart_exception("createSimDevice: the IPU simulator is not available; use createIpuModelDevice "
                               "or createCpuDevice.")

    def createOfflineIPUDevice(self, options: Optional[Mapping[str, Any]] = None) -> DeviceInfo:
        raise popart_exception("createOfflineIPUDevice: offline compilation for IPU hardware is not available "
                               "here; use createIpuModelDevice or createCpuDevice.")

    def enumerateDevices(self, pattern: SyncPattern = SyncPattern.Full, numIpus: int = 1,
                         deviceType: DeviceType = DeviceType.Ipu, connectionType: DeviceConnectionType =
                         DeviceConnectionType.Always, tilesPerIPU: int = 0) -> List[DeviceInfo]:
        """The IPU hardware devices present: none on this machine."""
        return []

    def _hardware(self, what: str, numIpus: int, tilesPerIpu: int,
                  connectionType: DeviceConnectionType) -> DeviceInfo:
        if not isinstance(connectionType, DeviceConnectionType):
            raise popart_exception(f"{what}: connectionType must be a popart.DeviceConnectionType, "
                                   f"not {connectionType!r}.")
        if not _hw_on_cpu():
            raise popart_exception(
                f"{what}: no IPU hardware is available on this machine (enumerateDevices() is empty). Use "
                f"DeviceManager().createCpuDevice() or createIpuModelDevice({{'numIPUs': {numIpus}}}) to run on "
                f"the CPU, or set the environment variable {IPU_HW_ENV}=cpu to run programs that acquire IPUs "
                f"on the CPU engine unchanged.")
        return DeviceInfo(DeviceType.Ipu, numIpus=numIpus, tilesPerIpu=tilesPerIpu or 1472,
                          connectionType=connectionType)

    def acquireAvailableDevice(self, numIpus: int = 1, tilesPerIpu: int = 0, pattern: SyncPattern = SyncPattern.Full,
                               connectionType: DeviceConnectionType = DeviceConnectionType.Always,
                               selectionCriterion: DeviceSelectionCriterion = DeviceSelectionCriterion.First
                               ) -> DeviceInfo:
        """The next free group of ``numIpus`` IPUs; raises here, where there are none."""
        if isinstance(numIpus, bool) or not isinstance(numIpus, int) or numIpus < 1:
            raise popart_exception(f"acquireAvailableDevice: numIpus must be a positive int, not {numIpus!r}.")
        return self._hardware(f"acquireAvailableDevice({numIpus})", numIpus, tilesPerIpu, connectionType)

    def acquireDeviceById(self, id: int, pattern: SyncPattern = SyncPattern.Full,
                          connectionType: DeviceConnectionType = DeviceConnectionType.Always) -> DeviceInfo:
        """The IPU configuration ``id`` of ``enumerateDevices``; raises here, where there are none."""
        if isinstance(id, bool) or not isinstance(id, int) or id < 0:
            raise popart_exception(f"acquireDeviceById: id must be a non-negative int, not {id!r}.")
        return self._hardware(f"acquireDeviceById({id})", 1, 0, connectionType)

    def setOnDemandAttachTimeout(self, seconds: int) -> None:
        """Accepted for compatibility: attaching to a CPU device never waits."""
