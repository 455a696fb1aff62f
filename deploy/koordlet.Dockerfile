# koordlet's container image. Build from the repository root:
#   docker build -f deploy/koordlet.Dockerfile -t koordlet:latest .
# The project is pure Python; the kubernetes extra brings the API client the DaemonSet needs.
# Test helpers (koord.testing) and the demos are not installed. agent_mode=dsMode gives
# upstream's DaemonSet defaults (/host-cgroup/, /host-sys/, /host-sys-fs/, /host-etc-hookserver/,
# /host-var-run/...), so this image also runs inside upstream's own koordlet DaemonSet.
FROM python:3.11.11-slim-bookworm
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN rm -rf src/koord/testing src/koord/demo.py src/koord/demo_docker.py \
    && pip install --no-cache-dir '.[kubernetes]' && rm -rf /src
ENV agent_mode=dsMode
WORKDIR /
ENTRYPOINT ["koordlet"]
