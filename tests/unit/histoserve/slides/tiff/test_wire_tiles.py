"""Which transport a slide takes: the slide's tiles, and where the server decodes them.

:func:`~histoserve.slides.tiff.wire_tiles.choose_transport` on its own:
``auto`` and ``jpeg`` take only a server that decodes on the CPU (``""``, a
gRPC-only run that cannot tell, counts as the CPU: its answers are checked),
``jpeg-device`` only one that says it decodes on the device; an explicit
choice that cannot be had fails the slide naming the decode and the flag.
"""

from __future__ import annotations

import pytest

from histoserve.errors import SlideError
from histoserve.slides.tiff.wire_tiles import TRANSPORTS, choose_transport

CANNOT = "the slide is not read natively (--reader)"


@pytest.mark.parametrize(
    ("requested", "problem", "decode", "taken"),
    [
        ("auto", None, "cpu", "jpeg"),
        ("auto", None, "", "jpeg"),
        ("auto", None, "device", "pixels"),
        ("auto", None, "mixed", "pixels"),
        ("auto", CANNOT, "cpu", "pixels"),
        ("jpeg", None, "cpu", "jpeg"),
        ("jpeg", None, "", "jpeg"),
        ("jpeg-device", None, "device", "jpeg-device"),
        ("pixels", None, "device", "pixels"),
        ("pixels", None, "cpu", "pixels"),
    ],
)
def test_each_choice_takes_only_the_decode_it_names(
    requested: str, problem: str | None, decode: str, taken: str
) -> None:
    assert requested in TRANSPORTS
    assert choose_transport(requested, "s.svs", problem, decode) == taken


@pytest.mark.parametrize(
    ("requested", "problem", "decode", "said"),
    [
        ("jpeg", None, "device", "its config: jpeg_decode 'device'"),
        ("jpeg", None, "mixed", "its config: jpeg_decode 'mixed'"),
        ("jpeg-device", None, "cpu", "its config: jpeg_decode 'cpu'"),
        ("jpeg-device", None, "", "no jpeg_decode (an older server, or gRPC metadata only)"),
        ("jpeg-device", CANNOT, "device", CANNOT),
        ("jpeg", CANNOT, "cpu", CANNOT),
    ],
)
def test_an_explicit_choice_that_cannot_be_had_fails_the_slide_saying_why(
    requested: str, problem: str | None, decode: str, said: str
) -> None:
    with pytest.raises(SlideError) as error:
        choose_transport(requested, "s.svs", problem, decode)
    message = str(error.value)
    assert message.startswith(f"slide s.svs: --transport {requested}: ")
    assert said in message
    if problem is None:  # the flag that takes this server's decode
        want = (
            "--transport jpeg or auto" if requested == "jpeg-device" else "--transport jpeg-device"
        )
        assert want in message
