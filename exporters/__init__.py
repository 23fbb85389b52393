"""hetobs exporters, installed as `hetobs.exporters` (exporters arrive with the telemetry issue).

Placeholder so the wheel mapping `"hetobs/exporters" = "exporters"` has a package to
install. Inside this package import only `hetobs.…` or relative names.
"""
