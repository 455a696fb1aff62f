# koordlet's container image. Build from the repository root:
#   docker build -f deploy/koordlet.Dockerfile -t koordlet:latest .
# The project is pure Python; the kubernetes extra brings the API client the DaemonSet needs.
FROM python:3.11-slim
WORKDIR /src
COPY pyproject.toml README.md ./
COPY src ./src
RUN pip install --no-cache-dir '.[kubernetes]' && rm -rf /src
WORKDIR /
ENTRYPOINT ["koordlet"]
