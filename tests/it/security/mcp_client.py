"""The MCP Python SDK (a client fieldgate did not write, installed by scripts/test-deps into
target/mcp-py) connecting over TLS with its client-credentials OAuth provider: on the
first 401 it reads fieldgate's resource metadata, discovers the provider, gets a token and
calls again, unaided.

`python3 mcp_client.py URL CA_FILE CLIENT_ID SCOPES TOOL ARGS_JSON` prints one JSON line:
{"tools": [...], "result": {...}} or {"error": "..."}.
"""
import asyncio
import json
import ssl
import sys

import httpx
from mcp import ClientSession
from mcp.client.auth import TokenStorage
from mcp.client.auth.extensions.client_credentials import ClientCredentialsOAuthProvider
from mcp.client.streamable_http import streamable_http_client


class Memory(TokenStorage):
    def __init__(self):
        self.tokens = None
        self.client = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, client_info):
        self.client = client_info


async def main():
    url, ca_file, client_id, scopes, tool, args = sys.argv[1:7]
    provider = ClientCredentialsOAuthProvider(
        server_url=url,
        storage=Memory(),
        client_id=client_id,
        client_secret=f"{client_id}-secret-0123456789",
        token_endpoint_auth_method="client_secret_basic",
        scopes=scopes,
    )
    tls = ssl.create_default_context(cafile=ca_file)
    async with httpx.AsyncClient(auth=provider, verify=tls, timeout=30) as http:
        async with streamable_http_client(url, http_client=http) as (read, write, _):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await session.list_tools()
                result = await session.call_tool(tool, json.loads(args))
                print(json.dumps({
                    "tools": sorted(t.name for t in tools.tools),
                    "result": {"isError": result.isError, "structured": result.structuredContent},
                }))


try:
    asyncio.run(main())
except BaseException as e:  # the test reads the reason
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    print(json.dumps({"error": f"{type(e).__name__}: {e}"}))
    sys.exit(1)
