# The inferwatch image: the wheel of this checkout installed into a slim Python, run as a non-root user.
# One image for every part (collector, exporter, simulator): the command picks the part.
#   docker build -t inferwatch .
#   docker run --rm inferwatch --help
FROM python:3.11-slim AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /dist .

FROM python:3.11-slim
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin inferwatch
COPY --from=build /dist/ /tmp/dist/
RUN pip install --no-cache-dir "$(echo /tmp/dist/inferwatch-*.whl)[all]" && rm -rf /tmp/dist
USER inferwatch
WORKDIR /home/inferwatch
ENV INFERWATCH_DATA_DIR=/home/inferwatch/data \
    INFERWATCH_HEALTH_URL=http://127.0.0.1:4318/healthz
EXPOSE 4317 4318 8000 9400
# The collector's health endpoint by default; the compose file points exporters and simulators at theirs.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['INFERWATCH_HEALTH_URL'], timeout=4)"]
ENTRYPOINT ["inferwatch"]
CMD ["--help"]
