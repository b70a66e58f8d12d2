# Image for Conch's web, worker and beat processes (docker-compose.yml).
# The console's third-party JavaScript, from npm at the versions package-lock.json pins.
FROM node:20-bookworm-slim AS assets
WORKDIR /app
COPY package.json package-lock.json ./
RUN npm ci --no-audit --no-fund --ignore-scripts && npm run -s vendor

FROM python:3.11-slim-bookworm
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY requirements.txt constraints.txt ./
RUN pip install -r requirements.txt -c constraints.txt
COPY . .
COPY --from=assets /app/static/vendor static/vendor
RUN useradd --create-home conch && mkdir -p /app/var && chown -R conch /app/var
USER conch
EXPOSE 8000
# The console (uvicorn, conch.web): slow clients are cut off after CONCH_WEB_HEADER_TIMEOUT_SECONDS and
# CONCH_WEB_BODY_TIMEOUT_SECONDS; request bodies are spooled under TMPDIR (/tmp) before a view runs.
CMD ["python", "-m", "conch.web", "--bind", "0.0.0.0:8000", "--workers", "3"]
