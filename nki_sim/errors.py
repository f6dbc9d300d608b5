"""Exceptions raised by the simulator.

Every simulator-detected kernel bug raises a subclass of :class:`NkiSimError` that *also*
derives from the builtin type the real toolchain raises (``SyntaxError`` for front-end
checks, ``IndexError`` for out-of-bounds accesses, ...), so ``pytest.raises(SyntaxError)``
written against real NKI works here too.  ``code`` holds the documented NKI error name
(``err_*``) where one exists; the message text uses the documented wording.
"""

from __future__ import annotations


class NkiSimError(Exception):
    """Base class of every simulator-detected error."""

    code: str = ""


class NkiCompileError(NkiSimError, SyntaxError):
    """A check the NKI front end performs at compile (trace) time."""

    def __init__(self, msg: str, code: str = ""):
        SyntaxError.__init__(self, msg)
        self.code = code or type(self).code

    def __str__(self) -> str:  # SyntaxError.__str__ would append "(file, line N)"
        return str(self.msg)


class PartitionLimitError(NkiCompileError):
    code = "err_num_partition_exceed_arch_limit"


class SizeLimitError(NkiCompileError):
    code = "err_size_of_dimension_exceed_arch_limit"


class PartitionMismatchError(NkiCompileError):
    code = "err_num_partition_mismatch"


class MemorySpaceError(NkiCompileError):
    code = "err_unsupported_memory"


class OutputDependencyError(NkiCompileError):
    code = "err_unexpected_output_dependencies"


class IndexingError(NkiCompileError):
    """Illegal subscript (mixing basic/advanced, 1-D arange, indirect index off the partition axis...)."""

    code = "err_unsupported_mixing_basic_advanced_tensor_indexing"


class BlockDimensionError(NkiCompileError):
    code = "err_leading_dimension_of_tensor_must_be_partition"


class NkiFrontEndWarning(UserWarning):
    """A construct the NKI front end accepts with a warning (or that nki_sim cannot classify)."""


class BlockDimensionWarning(NkiFrontEndWarning, FutureWarning):
    """Block dimensions on a Neuron SDK that still accepts them (deprecated in 2.23 / 2.24)."""


class ImmutableParameterError(NkiCompileError):
    code = "err_cannot_update_immutable_parameter"


class KernelSignatureError(NkiCompileError):
    """Misuse of the kernel calling convention (outputs, mutable parameters, nesting)."""


class ShapeError(NkiCompileError):
    code = "err_store_dst_shape_smaller_than_other_shape"


class DtypeError(NkiCompileError):
    """An operand dtype the instruction does not accept."""


class AccessOutOfBoundError(NkiSimError, IndexError):
    """Static (compile-time) out-of-bounds access: ``err_tensor_access_out_of_bound``."""

    code = "err_tensor_access_out_of_bound"


class IndirectIndexError(NkiSimError, IndexError):
    """Runtime out-of-bounds indirect DMA index (NumPy-style flattened message)."""


class UninitializedReadError(NkiSimError, RuntimeError):
    """A read of memory that was never written (poisoned)."""


class TargetError(NkiSimError, NotImplementedError):
    """A feature the selected target (trn1 / gen2) does not have."""


class NotEmulatedError(NotImplementedError, AttributeError):
    """An NKI name that exists in the real API but is not emulated by nki_sim."""


class DeviceRequiredError(NkiSimError, RuntimeError):
    """baremetal / benchmark / profile need a Neuron device."""


def not_emulated(qualname: str, instead: str = "") -> NotEmulatedError:
    extra = f"; {instead}" if instead else ""
    return NotEmulatedError(f"{qualname} is not emulated by nki_sim{extra}")
