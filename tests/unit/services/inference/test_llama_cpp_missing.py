"""Without llama-cpp-python (an opt-in package the install builds only when asked), the llama_cpp engine says how
to get it instead of failing with an ImportError deep in a start."""

import sys

import pytest

from orchard.errors import FailedPrecondition
from orchard.services.inference.engines import llama_cpp_batch


def test_a_missing_package_is_failed_precondition_naming_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # what `import llama_cpp` meets where it is not installed
    with pytest.raises(FailedPrecondition, match="ORCHARD_LLAMA_CPP=1 bash scripts/install.sh"):
        llama_cpp_batch._lib()
