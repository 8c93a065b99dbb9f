import { type Command, Option } from 'commander';
import { parse, required } from './command.ts';
import { CliError } from './errors.ts';

/** The flags `reserve` and `capacity --preview` share. */
export interface RequestOptions {
  tenant?: string;
  pool: string;
  gpus: number;
  class: 'gpu' | 'gpu.mig' | 'gpu.slot';
  for: number;
  nvlink?: boolean;
  cpus?: number;
  memory?: number;
  /** A MIG profile (`1g.10gb`): class gpu.mig with a selector on the profile. */
  mig?: string;
  start?: number;
  lease?: number;
  spot?: boolean;
  kubernetes?: boolean;
  gang?: number;
  topologyKey?: string;
  binding?: 'hold' | 'kubernetes' | 'node';
  profile?: string;
  profileVersion?: number;
}

/** Adds the request flags (seed: `reserve --tenant T --pool P --gpus N --for 8h …`). */
export function withRequestOptions(command: Command, mandatory: boolean): Command {
  const req = (flags: string, description: string) =>
    mandatory ? required(flags, description) : new Option(flags, description);
  return command
    .addOption(req('--pool <pool>', 'the pool, e.g. pool_01k…'))
    .addOption(req('--gpus <n>', 'how many devices').argParser(parse.positiveInt))
    .addOption(req('--for <duration>', 'how long, e.g. 8h, 90m, 2d').argParser(parse.duration))
    .addOption(
      new Option('--class <class>', 'device class').choices(['gpu', 'gpu.mig', 'gpu.slot']).default('gpu'),
    )
    .option('--nvlink', 'all devices on one node in one NVLink domain')
    .option('--mig <profile>', "MIG instances of this profile, e.g. 1g.10gb (class gpu.mig; a 'mig' pool)")
    .option('--cpus <n>', 'host vCPUs to book with them (0 to 4096)', parse.nonNegativeNumber)
    .option('--memory <GiB>', 'host memory in GiB to book with them (0 to 65536)', parse.nonNegativeNumber)
    .option('--start <when>', "a later start: ISO date-time, epoch ms or '+2h'", parse.instant)
    .option('--lease <seconds>', 'a renewable lease of this many seconds (60 to 86400)', parse.positiveInt)
    .option(
      '--spot',
      "spot: billed on the spot meter; a regular request may preempt it after the pool's notice (spot.noticeSeconds, 120 s by default)",
    )
    .option('--kubernetes', "binding: 'kubernetes' (the pool's owner only)")
    .addOption(
      new Option(
        '--binding <binding>',
        'hold (default), kubernetes, or node: whole bare machines of a tenantRoot pool with --profile deployed on them (--gpus is then the number of machines)',
      ).choices(['hold', 'kubernetes', 'node']),
    )
    .option('--profile <id>', 'with --binding node: the deploy profile (prof_…) installed on each machine')
    .option('--profile-version <n>', 'with --profile: its version (default the latest)', parse.positiveInt)
    .option(
      '--gang <n>',
      'a gang: this many nodes (2 to 64), each with --gpus, all or nothing',
      parse.positiveInt,
    )
    .option(
      '--topology-key <label>',
      "with --gang: every node on one value of this node label, e.g. 'fabric.domain'",
    );
}

/** The API request the flags describe (shared by reservations.create and capacity.preview). */
export function requestFromOptions(options: RequestOptions, tenantId: string) {
  if (options.pool === undefined || options.gpus === undefined || options.for === undefined) {
    throw new CliError('--preview needs --pool, --gpus and --for, as reserve does');
  }
  if ((options.profile !== undefined) !== (options.binding === 'node')) {
    throw new CliError(
      '--binding node and --profile <id> go together: the profile is deployed on each leased machine',
    );
  }
  if (options.kubernetes && options.binding !== undefined && options.binding !== 'kubernetes') {
    throw new CliError(`--kubernetes contradicts --binding ${options.binding}`);
  }
  if (options.topologyKey !== undefined && options.gang === undefined) {
    throw new CliError('--topology-key needs --gang <n>: it places the members of a gang');
  }
  const resources =
    options.cpus !== undefined || options.memory !== undefined
      ? {
          ...(options.cpus !== undefined ? { vcpu: options.cpus } : {}),
          ...(options.memory !== undefined ? { memoryGiB: options.memory } : {}),
        }
      : undefined;
  return {
    tenantId,
    poolId: options.pool,
    devices: [
      {
        class: options.mig !== undefined ? ('gpu.mig' as const) : options.class,
        count: options.gpus,
        ...(options.nvlink ? { topology: 'nvlink-all' as const } : {}),
        ...(options.mig !== undefined ? { selector: { attributes: { profile: options.mig } } } : {}),
      },
    ],
    duration: options.for,
    ...(options.start !== undefined ? { start: options.start } : {}),
    ...(resources ? { resources } : {}),
    ...(options.lease !== undefined ? { leaseSeconds: options.lease } : {}),
    ...(options.spot ? { spot: true } : {}),
    ...(options.kubernetes ? { binding: 'kubernetes' as const } : {}),
    ...(options.binding !== undefined ? { binding: options.binding } : {}),
    ...(options.profile !== undefined
      ? {
          node: {
            profileId: options.profile,
            ...(options.profileVersion !== undefined ? { profileVersion: options.profileVersion } : {}),
          },
        }
      : {}),
    ...(options.gang !== undefined
      ? {
          gang: {
            size: options.gang,
            ...(options.topologyKey !== undefined ? { topologyKey: options.topologyKey } : {}),
          },
        }
      : {}),
  };
}
