"""What the Debian package runs besides the two binaries: its copyright file's generator
(at build time, in the package's own environment) and the kubelet check of its prerm."""
