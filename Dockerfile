# The foreshock image used by docker-compose.yml (agent and workers).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /src

# Package folders (setuptools package-dir maps them under `foreshock`, see pyproject.toml).
COPY pyproject.toml README.md ./
COPY core/ core/
COPY cli/ cli/
COPY simulator/ simulator/
COPY streams/ streams/
COPY detectors/ detectors/
COPY exporters/ exporters/
COPY dashboards/ dashboards/
RUN pip install . && rm -rf /src/build

RUN useradd --system --create-home --uid 10001 foreshock
USER foreshock
WORKDIR /home/foreshock
EXPOSE 9108
CMD ["foreshock", "--help"]
