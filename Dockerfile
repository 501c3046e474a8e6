# Parsyn's container image: `parsyn` (coordinator, CLI, worker agent) and `parsyn-trainer` (libtorch), nothing else.
# Stage 1 builds them on Debian 12 with the project's own Debian packages; stage 2 is debian:12-slim with the two
# binaries and exactly the shared libraries they load (ldd), run as the unprivileged user `parsyn` (uid 10001).
#   docker build -t parsyn:dev .
#   docker run --rm -p 8080:8080 parsyn:dev            # a coordinator on SQLite in /var/lib/parsyn (a volume)
# Kubernetes manifests that run this image: deploy/kubernetes/ (docs/deploy.md). The command lines below (CMD) are
# started for real against the built binaries by tests/e2e/deploy_test.cc, so a renamed flag breaks a test.
# Debian 12's libtorch is built without CUDA: this image trains on CPU (docs/deploy.md, "GPUs").

FROM debian:12 AS build
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      cmake ninja-build g++ git ca-certificates \
      libssl-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev \
      libsqlite3-dev libpq-dev libcurl4-openssl-dev libboost1.74-dev libzstd-dev \
      libgtest-dev libgmock-dev libbenchmark-dev libtorch-dev libopenblas0-pthread libjemalloc-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPARSYN_BENCH=OFF \
    && cmake --build /build --target parsyn parsyn-trainer \
    && mkdir -p /out/bin /out/lib \
    && cp /build/src/cli/parsyn /build/src/cli/parsyn-trainer /out/bin/ \
    # The shared libraries the two binaries load, symlinks followed (libblas.so.3 is OpenBLAS's threaded build
    # through Debian's alternatives link: without it libtorch's fp32 matmul is ~15x slower).
    && ldd /out/bin/parsyn /out/bin/parsyn-trainer | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u \
       | xargs -r -I{} cp -L {} /out/lib/

FROM debian:12-slim
# ca-certificates: HTTPS to S3 and to a TLS coordinator. The libraries go to a folder of their own (ld.so.conf.d), so
# the base image's libc stays the one in use.
RUN apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 parsyn \
    && useradd --system --uid 10001 --gid parsyn --home-dir /var/lib/parsyn --shell /usr/sbin/nologin parsyn \
    && mkdir -p /var/lib/parsyn /var/cache/parsyn && chown parsyn:parsyn /var/lib/parsyn /var/cache/parsyn
COPY --from=build /out/lib/ /usr/local/lib/parsyn/
COPY --from=build /out/bin/ /usr/local/bin/
# glibc's own libraries stay the base image's (the same Debian 12 release); every other one must resolve.
RUN cd /usr/local/lib/parsyn && rm -f libc.so.* libm.so.* libpthread.so.* libdl.so.* librt.so.* ld-linux-* \
    && echo /usr/local/lib/parsyn > /etc/ld.so.conf.d/parsyn.conf && ldconfig \
    && ! ldd /usr/local/bin/parsyn /usr/local/bin/parsyn-trainer | grep 'not found' \
    && /usr/local/bin/parsyn --help >/dev/null
USER 10001:10001
ENV PARSYN_DATA_DIR=/var/lib/parsyn XDG_CACHE_HOME=/var/cache/parsyn
VOLUME ["/var/lib/parsyn"]
EXPOSE 8080
WORKDIR /var/lib/parsyn
ENTRYPOINT ["/usr/local/bin/parsyn"]
# A coordinator on SQLite and the data directory. The admin key is printed once and kept in /var/lib/parsyn/admin-key.
CMD ["server", "--listen", "0.0.0.0:8080", "--insecure", "--data-dir", "/var/lib/parsyn"]
