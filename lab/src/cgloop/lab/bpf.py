"""A tc (cls_bpf, direct-action) program that drops a fraction of packets at random.

This kernel has no netem and no gact action, so random loss is a six-instruction eBPF program:
draw `bpf_get_prandom_u32()`, drop (TC_ACT_SHOT) below a threshold, otherwise return
TC_ACT_UNSPEC so later filters on the same hook (e.g. the node agent's) still run. The program is
assembled here and loaded with the bpf(2) syscall: no compiler or object file is needed at run
time, and the probability is baked into the immediate of the compare.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import struct

_SYS_BPF = 321  # x86_64
_BPF_PROG_LOAD = 5
_BPF_PROG_TYPE_SCHED_CLS = 3

_TC_ACT_UNSPEC = -1
_TC_ACT_SHOT = 2
_BPF_FUNC_GET_PRANDOM_U32 = 7

# clsact's egress hook: TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS).
CLSACT_EGRESS = 0xFFFFFFF3


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def loss_program(probability: float) -> bytes:
    """eBPF bytecode that drops each packet with `probability` (0 < p <= 1)."""
    if not 0.0 < probability <= 1.0:
        raise ValueError(f"loss probability must be in (0, 1], got {probability}")
    # Drop when rand <= threshold; JMP32 compares the full unsigned 32-bit range.
    threshold = min(int(probability * 2**32) - 1, 2**32 - 1)
    imm = threshold - 2**32 if threshold >= 2**31 else threshold
    return b"".join(
        [
            _insn(0x85, imm=_BPF_FUNC_GET_PRANDOM_U32),  # call bpf_get_prandom_u32
            _insn(0x26, dst=0, off=2, imm=imm),  # if w0 > threshold goto pass (JMP32|JGT|K)
            _insn(0xB7, dst=0, imm=_TC_ACT_SHOT),  # r0 = TC_ACT_SHOT
            _insn(0x95),  # exit
            _insn(0xB7, dst=0, imm=_TC_ACT_UNSPEC),  # pass: r0 = TC_ACT_UNSPEC
            _insn(0x95),  # exit
        ]
    )


class _ProgLoadAttr(ctypes.Structure):
    # The prefix of `union bpf_attr` used by BPF_PROG_LOAD; the kernel zero-extends the rest.
    _fields_ = [
        ("prog_type", ctypes.c_uint32),
        ("insn_cnt", ctypes.c_uint32),
        ("insns", ctypes.c_uint64),
        ("license", ctypes.c_uint64),
        ("log_level", ctypes.c_uint32),
        ("log_size", ctypes.c_uint32),
        ("log_buf", ctypes.c_uint64),
        ("kern_version", ctypes.c_uint32),
        ("prog_flags", ctypes.c_uint32),
        ("prog_name", ctypes.c_char * 16),
    ]


def load_sched_cls(code: bytes, name: str = "cgl_lab_loss") -> int:
    """Load `code` as a BPF_PROG_TYPE_SCHED_CLS program; returns its fd (caller closes it)."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"GPL")
    log = ctypes.create_string_buffer(4096)
    attr = _ProgLoadAttr(
        prog_type=_BPF_PROG_TYPE_SCHED_CLS,
        insn_cnt=len(code) // 8,
        insns=ctypes.addressof(insns),
        license=ctypes.addressof(license_),
        log_level=1,
        log_size=len(log),
        log_buf=ctypes.addressof(log),
        prog_name=name.encode()[:15],
    )
    fd = libc.syscall(_SYS_BPF, _BPF_PROG_LOAD, ctypes.byref(attr), ctypes.sizeof(attr))
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, f"bpf(BPF_PROG_LOAD) failed: {os.strerror(err)}: {log.value.decode()}")
    return fd
