// A real OpenID Connect provider for Tessera's SSO tests: panva/oidc-provider on loopback, with
// discovery, a JWKS (RS256), a console client (Authorization Code + PKCE, with the provider's
// built-in login and consent pages), a confidential client allowed the client_credentials grant, and
// resource indicators so access tokens are JWTs for the audience "tessera". Access tokens carry
// a `groups` claim for the claim-to-role mapping. The private key is written to $KEY_OUT (PEM)
// so that the test can forge tokens signed by the right key but with wrong claims, and the
// public key to $PUB_OUT (for the HS256-with-the-public-key attack).
import fs from 'node:fs';
import Provider from 'oidc-provider';
import * as jose from 'jose';

const port = Number(process.env.PORT || 9090);
const issuer = `http://127.0.0.1:${port}`;
const { privateKey, publicKey } = await jose.generateKeyPair('RS256', { extractable: true });
const jwk = { ...(await jose.exportJWK(privateKey)), kid: 'k1', alg: 'RS256', use: 'sig' };
if (process.env.KEY_OUT) fs.writeFileSync(process.env.KEY_OUT, await jose.exportPKCS8(privateKey));
if (process.env.PUB_OUT) fs.writeFileSync(process.env.PUB_OUT, await jose.exportSPKI(publicKey));

const provider = new Provider(issuer, {
  jwks: { keys: [jwk] },
  scopes: ['openid', 'api'],
  clients: [{
    // The console: Authorization Code + PKCE.
    client_id: 'tessera-console',
    client_secret: 'console-secret',
    grant_types: ['authorization_code'],
    response_types: ['code'],
    redirect_uris: [process.env.REDIRECT_URI || 'http://127.0.0.1:8080/auth/callback'],
  }, {
    // The CLI: a public client using the device authorization grant.
    client_id: 'tessera-cli',
    token_endpoint_auth_method: 'none',
    grant_types: ['urn:ietf:params:oauth:grant-type:device_code'],
    redirect_uris: [],
    response_types: [],
  }, {
    client_id: 'tessera-ci',
    client_secret: 'ci-secret',
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    scope: 'api',
  }],
  // Every account signing in on the dev login page belongs to the groups in $GROUPS.
  findAccount: async (ctx, id) => ({
    accountId: id,
    claims: async () => ({ sub: id, groups: (process.env.GROUPS || 'vision-admins').split(',') }),
  }),
  claims: { openid: ['sub', 'groups'] },
  conformIdTokenClaims: false,
  pkce: { required: () => true },
  features: {
    devInteractions: { enabled: true },
    clientCredentials: { enabled: true },
    deviceFlow: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => 'https://tessera.test/api',
      useGrantedResource: () => true,
      getResourceServerInfo: () => ({
        scope: 'api',
        audience: 'tessera',
        accessTokenTTL: 600,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: 'RS256' } },
      }),
    },
  },
  extraTokenClaims: async () => ({ groups: (process.env.GROUPS || 'vision-admins').split(',') }),
});
provider.listen(port, '127.0.0.1', () => console.log(`ready ${issuer}`));
