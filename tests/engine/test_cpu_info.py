"""/proc/cpuinfo fields: the first processor's value, any of several names, empty when absent."""

from engine.cpu_info import cpuinfo_field

CPUINFO = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu avx512f

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu
"""


def test_the_first_processors_fields(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(CPUINFO)
    assert cpuinfo_field("vendor_id", path=str(path)) == "GenuineIntel"
    assert cpuinfo_field("model name", path=str(path)) == "Intel(R) Xeon(R) Processor"
    assert cpuinfo_field("Features", "flags", path=str(path)) == "fpu avx512f"  # either name (ARM says Features)
    assert cpuinfo_field("bogomips", path=str(path)) == ""


def test_no_file_gives_empty(tmp_path):
    assert cpuinfo_field("vendor_id", path=str(tmp_path / "absent")) == ""
