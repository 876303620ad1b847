# The Sandbar control service. docker-compose.yml runs it beside PostgreSQL.
FROM node:24-bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends git python3-pylsp bubblewrap ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY package.json package-lock.json ./
COPY packages ./packages
COPY proto ./proto
RUN npm ci --omit=dev --no-audit --no-fund
COPY . .
ENV SANDBAR_PORT=3000 SANDBAR_DATA_DIR=/var/lib/sandbar
EXPOSE 3000
CMD ["node", "packages/cli/src/main.ts", "serve"]
