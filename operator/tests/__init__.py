"""Tests of the operator. A package, so that pytest names its modules tests.*, never operator.* (which would
shadow the standard library's operator module)."""
