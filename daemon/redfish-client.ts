import {
  type BmcBootDevice,
  type BmcPowerAction,
  type BmcSystemView,
  bootDeviceFromRedfish,
  powerStateFromRedfish,
  redfishBootTargets,
  redfishResetTypes,
} from '../domain/metal-bmc.ts';

/** One BMC as the site agent reaches it: address, system, and the opened credentials. */
export interface RedfishTarget {
  address: string;
  systemId: string;
  username: string;
  password: string;
}

/** A BMC that failed to answer in time or answered an error; the message never holds the password. */
export class RedfishError extends Error {
  constructor(
    message: string,
    readonly status: number | null,
  ) {
    super(message);
  }
}

/**
 * A small Redfish client (DMTF Redfish over HTTP(S) with basic authentication): power, one-time
 * boot override, virtual media, and the system's inventory. Every request has a deadline, so a
 * BMC that stops answering fails the command instead of holding the site agent's lane.
 */
export class RedfishClient {
  constructor(
    private readonly target: RedfishTarget,
    private readonly timeoutMs = 10_000,
  ) {}

  private get systemPath(): string {
    return `/redfish/v1/Systems/${encodeURIComponent(this.target.systemId)}`;
  }

  private async request(method: string, path: string, body?: unknown): Promise<unknown> {
    const url = new URL(path, this.target.address);
    const auth = Buffer.from(`${this.target.username}:${this.target.password}`).toString('base64');
    let response: Response;
    try {
      response = await fetch(url, {
        method,
        headers: {
          authorization: `Basic ${auth}`,
          accept: 'application/json',
          ...(body === undefined ? {} : { 'content-type': 'application/json' }),
        },
        ...(body === undefined ? {} : { body: JSON.stringify(body) }),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (error) {
      const timedOut = (error as Error).name === 'TimeoutError';
      throw new RedfishError(
        timedOut
          ? `the BMC at ${url.origin} did not answer ${method} ${url.pathname} within ${this.timeoutMs} ms`
          : `the BMC at ${url.origin} is unreachable: ${(error as Error).message}`,
        null,
      );
    }
    const text = await response.text();
    if (!response.ok) {
      const why =
        response.status === 401
          ? 'the BMC refused the credentials'
          : `the BMC answered ${response.status} to ${method} ${url.pathname}`;
      throw new RedfishError(`${why}: ${text.slice(0, 300)}`, response.status);
    }
    return text ? JSON.parse(text) : null;
  }

  /** The system's power, boot override, NICs and virtual media, as the BMC reports them now. */
  async system(): Promise<BmcSystemView> {
    const system = (await this.request('GET', this.systemPath)) as Record<string, any>;
    const boot = (system.Boot ?? {}) as Record<string, string>;
    // The sub-resources are read side by side: a BMC command's answer costs one round trip each.
    const [macs, virtualMedia] = await Promise.all([
      this.macs(system.EthernetInterfaces?.['@odata.id']),
      this.virtualMedia(),
    ]);
    return {
      systemId: this.target.systemId,
      name: system.Name ?? null,
      uuid: system.UUID ?? null,
      powerState: powerStateFromRedfish(system.PowerState),
      redfishPowerState: system.PowerState ?? null,
      bootDevice: bootDeviceFromRedfish(boot.BootSourceOverrideTarget),
      bootOverride: boot.BootSourceOverrideTarget ?? null,
      macs,
      virtualMedia,
    };
  }

  private async macs(collectionPath: string | undefined): Promise<string[]> {
    if (!collectionPath) return [];
    const collection = (await this.request('GET', collectionPath)) as {
      Members?: Array<{ '@odata.id': string }>;
    };
    const nics = (await Promise.all(
      (collection.Members ?? []).map((member) => this.request('GET', member['@odata.id'])),
    )) as Array<{ MACAddress?: string }>;
    return nics.flatMap((nic) => (nic.MACAddress ? [nic.MACAddress.toLowerCase()] : []));
  }

  private async virtualMedia(): Promise<BmcSystemView['virtualMedia']> {
    let collection: { Members?: Array<{ '@odata.id': string }> };
    try {
      collection = (await this.request('GET', `${this.systemPath}/VirtualMedia`)) as typeof collection;
    } catch (error) {
      if (error instanceof RedfishError && error.status === 404) return [];
      throw error;
    }
    const devices = (await Promise.all(
      (collection.Members ?? []).map((member) => this.request('GET', member['@odata.id'])),
    )) as Array<Record<string, any>>;
    return devices.map((media) => ({
      id: String(media.Id),
      inserted: Boolean(media.Inserted),
      image: media.Image || null,
    }));
  }

  /** The system's Redfish `PowerState` alone (one request: what a wait for a power change polls). */
  async redfishPowerState(): Promise<string | null> {
    const system = (await this.request('GET', this.systemPath)) as { PowerState?: string };
    return system.PowerState ?? null;
  }

  /** Asks for a power change; a BMC applies it some seconds later (`waitForPower` waits for it). */
  async power(action: BmcPowerAction): Promise<void> {
    await this.request('POST', `${this.systemPath}/Actions/ComputerSystem.Reset`, {
      ResetType: redfishResetTypes[action],
    });
  }

  /**
   * Polls the system's power state every `pollMs` until it is `want` or `timeoutMs` passes
   * (RedfishError then); answers the whole system once it is. Each poll is one request, so a site
   * agent waiting on many machines at once does not flood their BMCs.
   */
  async waitForPower(want: 'on' | 'off', timeoutMs: number, pollMs = 1_000): Promise<BmcSystemView> {
    const deadline = Date.now() + timeoutMs; // wall time: a deadline on a real device's answer
    const wanted = want === 'on' ? 'On' : 'Off';
    for (;;) {
      const state = await this.redfishPowerState();
      if (state === wanted) {
        const view = await this.system();
        if (view.redfishPowerState === wanted) return view;
      }
      if (Date.now() > deadline) {
        throw new RedfishError(
          `the BMC did not reach power ${want} within ${timeoutMs} ms (it reports ${state})`,
          null,
        );
      }
      await new Promise((resolve) => setTimeout(resolve, pollMs));
    }
  }

  /** Sets the boot device for the next boot only. */
  async bootOnce(device: BmcBootDevice): Promise<void> {
    await this.request('PATCH', this.systemPath, {
      Boot: { BootSourceOverrideTarget: redfishBootTargets[device], BootSourceOverrideEnabled: 'Once' },
    });
  }

  /** Inserts `imageUrl` into the virtual CD (the BMC fetches it). */
  async insertMedia(imageUrl: string): Promise<void> {
    await this.request('POST', `${this.systemPath}/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia`, {
      Image: imageUrl,
      Inserted: true,
      WriteProtected: true,
    });
  }

  async ejectMedia(): Promise<void> {
    await this.request('POST', `${this.systemPath}/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia`, {});
  }
}
