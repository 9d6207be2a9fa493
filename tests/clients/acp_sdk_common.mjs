// What the ACP TypeScript SDK scripts share (acp_sdk.mjs, acp_sdk_reload.mjs,
// acp_sdk_ended.mjs): the SDK loaded from its folder, and a factory of new connections
// to our /acp over the SDK's Streamable HTTP client or its WebSocket client.
//
//   const { acp, stream } = await loadSdk(sdkDir, baseUrl, "ws");
//   await acp.client().connectWith(stream(), async (ctx) => { ... });
import { pathToFileURL } from "node:url";
import path from "node:path";

export async function loadSdk(sdkDir, baseUrl, transport) {
  const load = (rel) => import(pathToFileURL(path.join(sdkDir, rel)).href);
  const acp = await load("dist/v1/stable/acp.js");
  const { createHttpStream } = await load("dist/transports/http-stream.js");
  const { createWebSocketStream } = await load("dist/transports/ws-stream.js");
  const stream = () => transport === "ws"
    ? createWebSocketStream(baseUrl.replace(/^http/, "ws") + "/acp",
                            { WebSocket: globalThis.WebSocket })
    : createHttpStream(baseUrl + "/acp");
  return { acp, stream };
}
