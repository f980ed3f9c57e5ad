# stepscope on a CUDA host. Build:  docker build -t stepscope .
# Record a job (GPU visible to the container, NVML through the NVIDIA container toolkit):
#   docker run --gpus all -v $PWD:/work -v stepscope-home:/home/stepscope/.stepscope \
#       stepscope run -- python /work/train.py
# Attach to a job running in another container (`stepscope attach PID`): py-spy reads
# the job's memory, which needs the same PID namespace and the ptrace capability:
#   docker run --pid container:<job> --cap-add SYS_PTRACE stepscope attach <PID>
# (as the job's user, or root). Without them the attach still records psutil and NVML
# samples, and says why it has no stacks.
# The PyTorch base image already holds a CUDA build of torch, so pip keeps it
# (pyproject asks for torch>=2.1) instead of pulling a second, CPU-only one.
FROM pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

RUN useradd --create-home --uid 1000 stepscope
WORKDIR /opt/stepscope
COPY pyproject.toml README.md ./
COPY stepscope ./stepscope
COPY examples ./examples
RUN pip install '.[s3]' && python -c "import stepscope, torch; print(stepscope.__version__, torch.__version__)"

USER stepscope
ENV STEPSCOPE_HOME=/home/stepscope/.stepscope
# The dashboard binds to 127.0.0.1 unless told otherwise, and any other address needs
# --allow-remote: inside a container pass both, and publish the port on the host's
# loopback on purpose:
#   docker run --gpus all -p 127.0.0.1:8501:8501 stepscope demo --host 0.0.0.0 --allow-remote
#   docker run -p 127.0.0.1:8501:8501 -v stepscope-home:/home/stepscope/.stepscope \
#       stepscope dashboard --host 0.0.0.0 --allow-remote
# A team's shared store and artifacts (docs/guides/shared-store.md): pass the URLs and the
# usual AWS variables; the password and keys are never recorded:
#   docker run -e STEPSCOPE_STORE=postgresql://user:pw@db/stepscope \
#       -e STEPSCOPE_ARTIFACTS=s3://bucket/stepscope -e AWS_ACCESS_KEY_ID -e AWS_SECRET_ACCESS_KEY \
#       --gpus all -v $PWD:/work stepscope run -- python /work/train.py
EXPOSE 8501
ENTRYPOINT ["stepscope"]
CMD ["--help"]
