// A strict WebSocket client (Node's, as a browser's: it fails a handshake whose answer
// chooses none of the subprotocols it offered) carrying its token as the bearer
// subprotocol, beside the qwen-ws marker and alone. Prints one JSON object:
// {cases: [{offered, opened, protocol, reply, error}]}.
// usage: node ws_bearer.mjs BASE_URL TOKEN
const [baseUrl, token] = process.argv.slice(2);
const url = baseUrl.replace(/^http/, "ws") + "/acp";
const bearer = `qwen-bearer.${Buffer.from(token).toString("base64url")}`;

function attempt(offered) {
  return new Promise((resolve) => {
    const seen = { offered: offered.length, opened: false, protocol: null, reply: null,
                   error: null };
    const ws = new WebSocket(url, offered);
    const done = () => resolve(seen);
    const timer = setTimeout(() => { seen.error = "timeout"; try { ws.close(); } catch {} done(); },
                             20000);
    ws.onopen = () => {
      seen.opened = true;
      seen.protocol = ws.protocol;
      ws.send(JSON.stringify({ jsonrpc: "2.0", id: 0, method: "initialize",
                               params: { protocolVersion: 1 } }));
    };
    ws.onmessage = (m) => {
      seen.reply = JSON.parse(String(m.data)).result?.protocolVersion ?? null;
      ws.close(1000);
    };
    ws.onerror = (e) => { seen.error = e.message || e.type; if (!seen.opened) { clearTimeout(timer); done(); } };
    ws.onclose = () => { clearTimeout(timer); done(); };
  });
}

const cases = [];
for (const offered of [["qwen-ws", bearer], [bearer, "qwen-ws"], [bearer]]) {
  cases.push(await attempt(offered));
}
console.log(JSON.stringify({ cases }));
