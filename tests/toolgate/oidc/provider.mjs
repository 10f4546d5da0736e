// A real OpenID provider for the single sign-on tests (oidc-provider, with its development
// login and consent pages): one confidential client, and the users' groups in a claim.
// PORT, REDIRECT_URI and GROUPS (JSON: {"user": ["group", ...]}) come from the environment;
// REMOVED names a file the tests write, a JSON list of the users removed at the provider since.
import { existsSync, readFileSync } from "node:fs";
import Provider from "oidc-provider";

function removed(id) {
  const path = process.env.REMOVED;
  return Boolean(path && existsSync(path) && JSON.parse(readFileSync(path, "utf8")).includes(id));
}

const port = Number(process.env.PORT);
const groups = JSON.parse(process.env.GROUPS || "{}");
const provider = new Provider(`http://127.0.0.1:${port}`, {
  clients: [
    {
      client_id: "toolgate",
      client_secret: "toolgate-test-secret",
      redirect_uris: [process.env.REDIRECT_URI],
      grant_types: ["authorization_code", "refresh_token"],
      response_types: ["code"],
    },
  ],
  claims: {
    openid: ["sub"],
    profile: ["preferred_username", "name"],
    email: ["email", "email_verified"],
    groups: ["groups"],
  },
  scopes: ["openid", "profile", "email", "groups"],
  cookies: { keys: ["toolgate-test-cookie-key"] },
  // A refresh token at every login, as providers give one with offline_access.
  async issueRefreshToken(ctx, client) {
    return client.grantTypeAllowed("refresh_token");
  },
  async findAccount(ctx, id) {
    if (removed(id)) return undefined;
    return {
      accountId: id,
      async claims() {
        return {
          sub: id,
          preferred_username: id,
          name: id,
          email: `${id}@example.test`,
          email_verified: true,
          groups: groups[id] || [],
        };
      },
    };
  },
});
provider.listen(port, "127.0.0.1", () => console.log(`listening ${port}`));
