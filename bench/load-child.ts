/**
 * A closed-loop load of creates in a process of its own (bench/support.ts, `loadInChild`): the
 * clients are not the control plane, so their CPU is measured apart from it. Its input is one
 * JSON object as its argument; its last line is one JSON object: the load's result and the CPU
 * seconds this process used while running it.
 */
import { type BenchTenant, type CreateShape, createReservationClient } from './create-client.ts';
import { runLoad } from './support.ts';

const input = JSON.parse(process.argv[2]!) as {
  url: string;
  poolId: string;
  tenants: BenchTenant[];
  clients: number;
  seconds: number;
  shape: CreateShape;
};
const client = createReservationClient(input.url, {
  poolId: input.poolId,
  tenants: input.tenants,
  keyPrefix: `bench-child-${process.pid}-`,
  sockets: input.clients,
});
const before = process.cpuUsage();
const result = await runLoad(input.clients, input.seconds, (c) => client.place(c, input.shape));
const used = process.cpuUsage(before);
client.close();
console.log(JSON.stringify({ result, cpuSeconds: (used.user + used.system) / 1e6 }));
