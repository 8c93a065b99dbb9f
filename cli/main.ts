import { Command } from 'commander';
import { usageExits } from './command.ts';
import { registerAccessCommands } from './commands/access.ts';
import { registerCapacityCommands } from './commands/capacity.ts';
import { registerEventCommands } from './commands/events.ts';
import { registerMetalCommands, registerSiteCommands } from './commands/metal.ts';
import { registerNodeCommands } from './commands/nodes.ts';
import { registerPoolCommands } from './commands/pools.ts';
import { registerReleaseCommands } from './commands/releases.ts';
import { registerReservationCommands } from './commands/reservations.ts';
import { registerRolloutCommands } from './commands/rollouts.ts';
import { registerServerCommands } from './commands/server.ts';

/**
 * `better-compute`: one program for operators and tenants. Each command lives in its own file
 * under cli/commands/ and registers itself here.
 */
export function buildProgram(): Command {
  const program = new Command('better-compute')
    .description('Better Compute: GPU and CPU capacity, reserved, bound and released safely.')
    .showHelpAfterError('(run with --help for usage)')
    .enablePositionalOptions();
  registerServerCommands(program);
  registerReservationCommands(program);
  registerCapacityCommands(program);
  registerNodeCommands(program);
  registerPoolCommands(program);
  registerAccessCommands(program);
  registerEventCommands(program);
  registerReleaseCommands(program);
  registerRolloutCommands(program);
  registerSiteCommands(program);
  registerMetalCommands(program);
  usageExits(program);
  return program;
}

await buildProgram().parseAsync(process.argv);
